//! Batches straight into ONNX Runtime's CUDA execution provider, zero-copy, on the pipeline's
//! own stream.
//!
//! ```text
//! pip install onnxruntime-gpu      # the CUDA provider ships only in this wheel
//! ORT_DYLIB_PATH=$(python3 -c 'import onnxruntime, pathlib; print(next((pathlib.Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*")))') \
//!   cargo run --release --features ort --example ort_cuda -- model.onnx images/
//! ```
//!
//! The model takes one `[N, 3, 224, 224]` float32 input and returns `[N, classes]` scores.
//! The session's CUDA execution provider is given the pipeline's stream
//! (`with_compute_stream`), so it reads every batch after the kernel that wrote it, with no
//! event and no host wait; ONNX Runtime synchronizes that stream at the end of each run, so
//! the batch may be dropped as soon as `run` returns.

use std::error::Error;

use gpufeed::interop::ort::{compute_stream, input};
use gpufeed::{DType, Device, Pipeline, Source};
use ort::ep::CUDA;
use ort::session::Session;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(images)) = (args.next(), args.next()) else {
        return Err("usage: ort_cuda MODEL.onnx IMAGE_DIR".into());
    };
    let library = std::env::var("ORT_DYLIB_PATH")
        .map_err(|_| "set ORT_DYLIB_PATH to onnxruntime-gpu's libonnxruntime.so")?;

    let mut pipeline = Pipeline::builder()
        .source(Source::directory(&images)?)
        .batch_size(64)
        .dtype(DType::F32)
        .device(Device::Cuda(0))
        .build()?;
    let stream = pipeline
        .cuda_stream()
        .ok_or("the pipeline has no CUDA stream")?
        .clone();

    let environment = ort::init_from(&library)?.build()?;
    // SAFETY: the pipeline's stream outlives the session: `stream` holds it until the end of
    // `main`, after the session is dropped.
    let provider = unsafe { CUDA::default().with_compute_stream(compute_stream(&stream)) };
    let mut session = Session::builder(&environment)?
        .with_execution_providers([provider.build().error_on_failure()])?
        .commit_from_file(&model)?;

    let mut images_seen = 0;
    while let Some(batch) = pipeline.next_batch()? {
        let outputs = session.run(ort::inputs![input(batch.images())?])?;
        let (shape, scores) = outputs[0].try_extract_tensor::<f32>()?;
        let classes = shape[1] as usize;
        for (id, row) in batch.ids().iter().zip(scores.chunks(classes)) {
            let best = row
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(class, _)| class);
            println!("{id}\t{best}");
        }
        images_seen += batch.len();
    }
    eprintln!("{images_seen} images through {model}");
    Ok(())
}
