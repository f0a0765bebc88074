//! A pipeline of views (`PipelineBuilder::views`): every view of every image equal to
//! `gpufeed::cpu::render_views` followed by the CPU normalize, whatever the threads, after a
//! resume and in shards; on a CUDA device equal to the CPU device's (the GPU test prints
//! `skipped: no CUDA device` and passes where there is no GPU, and fails instead when
//! `GPUFEED_REQUIRE_GPU=1`).

mod common;

use std::collections::BTreeSet;

use common::gpu_present;
use gpufeed::views::{ViewDraw, Views};
use gpufeed::{
    DType, Decode, DecodeOptions, Device, Layout, OutputOptions, Pipeline, PipelineBuilder,
    PipelineState, Source, Tensor,
};

/// The bundled photos and every test fixture (some of which fail to decode and are skipped).
fn paths() -> Vec<std::path::PathBuf> {
    let mut paths: Vec<_> = std::fs::read_dir(common::repo_path("assets"))
        .expect("assets/")
        .chain(std::fs::read_dir(common::repo_path("tests/fixtures")).expect("tests/fixtures/"))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e != "md" && e != "txt"))
        .collect();
    paths.sort();
    paths
}

fn builder(views: Views, device: Device) -> PipelineBuilder {
    Pipeline::builder()
        .source(Source::paths(paths()))
        .views(views)
        .device(device)
        .dtype(DType::F32)
        .batch_size(4)
}

/// One image of a batch, as the pipeline gave it: its source index, its views' draws and, per
/// view, its normalized values (f32 bits, in the tensor's layout).
#[derive(Debug, PartialEq)]
struct Row {
    index: usize,
    epoch: u64,
    /// The row pads its shard (a repeat).
    padded: bool,
    draws: Vec<ViewDraw>,
    values: Vec<Vec<u32>>,
}

/// Every row of a batch of views, each tensor's shape checked.
fn rows(batch: &gpufeed::Batch, views: &Views, layout: Layout) -> Vec<Row> {
    let n = batch.len();
    let tensors = batch.views().expect("views");
    assert_eq!(tensors.len(), views.groups.len());
    assert!(batch.images().is_empty(), "no images beside views");
    let draws = batch.view_draws().expect("view draws");
    assert_eq!(draws.len(), n);
    let mut out: Vec<Row> = (0..n)
        .map(|i| Row {
            index: batch.indices()[i],
            epoch: batch.epoch(),
            padded: batch.padded()[i],
            draws: draws[i].clone(),
            values: Vec::new(),
        })
        .collect();
    for (tensor, group) in tensors.iter().zip(&views.groups) {
        let (count, size) = (group.count as usize, group.size as usize);
        let want = match layout {
            Layout::Nchw => vec![count, n, 3, size, size],
            _ => vec![count, n, size, size, 3],
        };
        assert_eq!(tensor.shape(), want.as_slice());
        let host = tensor.to_host().expect("to_host");
        let bits: Vec<u32> = host.to_f32_vec().iter().map(|v| v.to_bits()).collect();
        let view = size * size * 3;
        for j in 0..count {
            for (i, row) in out.iter_mut().enumerate() {
                let at = (j * n + i) * view;
                row.values.push(bits[at..at + view].to_vec());
            }
        }
    }
    out
}

/// The rows of every batch of the current epoch.
fn epoch_rows(pipeline: &mut Pipeline, layout: Layout) -> Vec<Row> {
    let views = pipeline.views().expect("a pipeline of views").clone();
    let mut out = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("next_batch") {
        out.extend(rows(&batch, &views, layout));
    }
    out
}

/// What `render_views` and the CPU normalize give for the image of `row`.
fn reference(row: &Row, views: &Views, output: OutputOptions) -> Row {
    let bytes = std::fs::read(&paths()[row.index]).expect("read");
    let made = gpufeed::cpu::render_views(
        &bytes,
        &DecodeOptions::default(),
        views,
        row.index,
        row.epoch,
    )
    .expect("render_views");
    let spec = output.spec();
    Row {
        index: row.index,
        epoch: row.epoch,
        padded: row.padded,
        draws: made.iter().map(|v| v.draw.clone()).collect(),
        values: made
            .iter()
            .map(|v| {
                let size = v.draw.size as usize;
                let t = gpufeed::cpu::normalize(&v.pixels, 1, size, size, &spec);
                t.to_f32_vec().iter().map(|x| x.to_bits()).collect()
            })
            .collect(),
    }
}

fn check_against_reference(rows: &[Row], views: &Views, output: OutputOptions) {
    for row in rows {
        let want = reference(row, views, output);
        assert_eq!(row.draws, want.draws, "image {}", row.index);
        for (v, (got, want)) in row.values.iter().zip(&want.values).enumerate() {
            assert!(
                got == want,
                "image {} epoch {} view {v}: the pipeline's view differs from render_views",
                row.index,
                row.epoch
            );
        }
    }
}

#[test]
fn cpu_views_equal_render_views_for_every_image_whatever_the_threads() {
    let views = Views::dinov2().seed(5);
    let output = OutputOptions::default().dtype(DType::F32);
    let mut seen = Vec::new();
    for threads in [1, 3] {
        let mut pipeline = builder(views.clone(), Device::Cpu)
            .threads(threads)
            .build()
            .expect("build");
        assert!(
            pipeline.decode_description().contains("CPU decode"),
            "{}",
            pipeline.decode_description()
        );
        let rows = epoch_rows(&mut pipeline, Layout::Nchw);
        let report = pipeline.epoch_report();
        assert_eq!(rows.len() + report.skipped.len(), paths().len());
        assert!(rows.len() >= 20, "{} good images", rows.len());
        check_against_reference(&rows, &views, output);
        seen.push(rows);
    }
    assert_eq!(seen[0], seen[1], "1 and 3 threads give the same views");
}

#[test]
fn views_take_the_layout_dtype_and_mean_std_and_a_new_epoch_draws_anew() {
    let views = Views::simclr().seed(2);
    let (mean, std) = ([0.5, 0.4, 0.3], [0.2, 0.25, 0.3]);
    let output = OutputOptions::default()
        .dtype(DType::F32)
        .layout(Layout::Nhwc)
        .mean_std(mean, std);
    let mut pipeline = builder(views.clone(), Device::Cpu)
        .layout(Layout::Nhwc)
        .mean_std(mean, std)
        .batch_size(7)
        .build()
        .expect("build");
    let first = epoch_rows(&mut pipeline, Layout::Nhwc);
    check_against_reference(&first, &views, output);
    for batch in &mut pipeline {
        let batch = batch.expect("batch");
        assert_eq!(batch.epoch(), 1);
        let rows = rows(&batch, &views, Layout::Nhwc);
        check_against_reference(&rows, &views, output);
        let before = first
            .iter()
            .find(|r| r.index == rows[0].index)
            .expect("seen");
        assert_ne!(before.draws, rows[0].draws, "epoch 1 draws anew");
    }
    // f16 keeps the shape, in half the bytes.
    let mut half = builder(views, Device::Cpu)
        .dtype(DType::F16)
        .build()
        .expect("build");
    let batch = half.next_batch().expect("next").expect("a batch");
    let tensor = &batch.views().expect("views")[0];
    assert_eq!(tensor.dtype(), DType::F16);
    assert_eq!(tensor.shape(), [2, 4, 3, 224, 224]);
}

#[test]
fn views_resume_exactly_and_shards_split_the_images() {
    let views = Views::dinov2().seed(9);
    let layout = Layout::Nchw;
    let shuffled = || builder(views.clone(), Device::Cpu).shuffle(4).batch_size(3);
    let mut whole = shuffled().build().expect("build");
    let all = epoch_rows(&mut whole, layout);
    // Stop after two batches, save, resume in a new pipeline.
    let mut first = shuffled().build().expect("build");
    let mut head = Vec::new();
    for _ in 0..2 {
        let batch = first.next_batch().expect("next").expect("a batch");
        head.extend(rows(&batch, &views, layout));
    }
    let text = first.state().to_json();
    drop(first);
    let state = PipelineState::from_json(&text).expect("the state reads back");
    let mut resumed = shuffled().resume(state.clone()).build().expect("resume");
    head.extend(epoch_rows(&mut resumed, layout));
    assert_eq!(
        head, all,
        "the resumed run gives the same views, byte for byte"
    );
    // A state of views resumes no pipeline of images, nor of other views.
    let images = Pipeline::builder()
        .source(Source::paths(paths()))
        .shuffle(4)
        .batch_size(3)
        .device(Device::Cpu)
        .resume(state.clone())
        .build();
    let refused = images.expect_err("refused").to_string();
    assert!(refused.contains("views"), "{refused}");
    let other = builder(Views::dinov2().seed(10), Device::Cpu)
        .shuffle(4)
        .batch_size(3)
        .resume(state)
        .build();
    assert!(other.is_err());
    // Two shards: disjoint, together every image, each view as rendered.
    let mut indices = Vec::new();
    for rank in 0..2 {
        let mut shard = shuffled().shard(rank, 2).build().expect("shard");
        let rows = epoch_rows(&mut shard, layout);
        check_against_reference(&rows, &views, OutputOptions::default().dtype(DType::F32));
        let own = rows.iter().filter(|r| !r.padded);
        indices.push(own.map(|r| r.index).collect::<BTreeSet<_>>());
    }
    let every: BTreeSet<usize> = all.iter().map(|r| r.index).collect();
    assert!(indices[0].is_disjoint(&indices[1]));
    let union: BTreeSet<usize> = indices[0].union(&indices[1]).copied().collect();
    assert_eq!(union, every);
}

#[test]
fn views_refuse_options_for_one_image_each() {
    let refused = |b: PipelineBuilder| b.build().expect_err("refused").to_string();
    let e = refused(
        builder(Views::dinov2(), Device::Cpu).augment(gpufeed::Augment::TrivialAugmentWide),
    );
    assert!(e.contains("views"), "{e}");
    let e = refused(
        builder(Views::dinov2(), Device::Cpu).patches(gpufeed::patches::Patches::qwen2_vl()),
    );
    assert!(e.contains("views"), "{e}");
    let mut bad = Views::dinov2();
    bad.groups[0].count = 0;
    assert!(builder(bad, Device::Cpu).build().is_err());
    // Views no machine's memory holds (64 of 8192 x 8192, 12.9 GB an image): refused before
    // anything is allocated, naming the views.
    let huge = Views::from_json(r#"[{"size": 8192, "count": 64}]"#).expect("a valid spec");
    let e = refused(builder(huge, Device::Cpu).batch_size(256));
    assert!(
        e.contains("invalid option views: one image's 64 views take"),
        "{e}"
    );
}

/// Fills the views' memory with all bits set before it goes back to the pool, so that a view
/// the next batch does not write shows.
fn poison(mut batch: gpufeed::Batch) {
    for tensor in batch.take_views().expect("views") {
        let Tensor::Device(tensor) = tensor else {
            panic!("views on the device")
        };
        let stream = tensor.stream().clone();
        let poisoned = match tensor.into_data().expect("the views' memory") {
            gpufeed::DeviceData::F32(mut s) => {
                stream.memcpy_htod(&vec![f32::from_bits(u32::MAX); s.len()], &mut s)
            }
            gpufeed::DeviceData::F16(mut s) => stream.memcpy_htod(
                &vec![gpufeed::half::f16::from_bits(u16::MAX); s.len()],
                &mut s,
            ),
            gpufeed::DeviceData::BF16(mut s) => stream.memcpy_htod(
                &vec![gpufeed::half::bf16::from_bits(u16::MAX); s.len()],
                &mut s,
            ),
            _ => Ok(()),
        };
        poisoned.expect("poisoning the views");
        stream.synchronize().expect("poisoned");
    }
}

#[test]
fn gpu_views_equal_the_cpu_device_s() {
    if !gpu_present("gpu_views_equal_the_cpu_device_s") {
        return;
    }
    for (views, dtype, layout) in [
        (Views::dinov2().seed(1), DType::F16, Layout::Nchw),
        (Views::dinov2().seed(2), DType::BF16, Layout::Nhwc),
        (Views::simclr().seed(3), DType::F32, Layout::Nchw),
    ] {
        let make = |device| {
            builder(views.clone(), device)
                .dtype(dtype)
                .layout(layout)
                .batch_size(5)
                .build()
                .expect("build")
        };
        let (mut cpu, mut gpu) = (make(Device::Cpu), make(Device::Cuda(0)));
        assert!(gpu.cuda_stream().is_some());
        same_batches(&mut cpu, &mut gpu, &format!("{dtype:?} {layout:?}"));
    }
}

/// Checks that `gpu` gives the batches `cpu` gives over two epochs (indices, draws, each view's
/// bytes), poisoning each after the check; returns the images the GPU decode lane made.
fn same_batches(cpu: &mut Pipeline, gpu: &mut Pipeline, what: &str) -> usize {
    let mut on_gpu = 0;
    for epoch in 0..2 {
        if epoch > 0 {
            assert_eq!(cpu.next_epoch().expect("next epoch"), epoch);
            assert_eq!(gpu.next_epoch().expect("next epoch"), epoch);
        }
        while let Some(want) = cpu.next_batch().expect("CPU batch") {
            let got = gpu
                .next_batch()
                .expect("GPU batch")
                .expect("as many batches");
            assert_eq!(got.indices(), want.indices(), "{what}");
            assert_eq!(got.view_draws(), want.view_draws(), "{what}");
            assert!(got.uploaded_bytes() > 0 || got.decoded_by().1 == got.len());
            on_gpu += got.decoded_by().1;
            for (g, w) in got
                .views()
                .expect("views")
                .iter()
                .zip(want.views().expect("views"))
            {
                assert!(g.as_device().is_some(), "on the device");
                assert_eq!(g.shape(), w.shape());
                let (g, w) = (g.to_host().expect("to_host"), w.to_host().expect("host"));
                assert!(
                    g.to_le_bytes() == w.to_le_bytes(),
                    "{what}, epoch {epoch}: GPU views differ from the CPU device's for {:?} \
                     (decoded by {:?})",
                    want.ids(),
                    got.decoded_by()
                );
            }
            poison(got);
        }
        assert!(gpu.next_batch().expect("GPU end").is_none());
    }
    on_gpu
}

/// The GPU decode lane makes views beside the CPU lane, each image decoded once on the GPU and
/// its views resized there: the same bytes as the CPU device's, whichever lane made an image
/// (every JPEG offered to the GPU lane, half of them, none: the CPU lane working ahead alone).
#[test]
fn gpu_lane_views_equal_the_cpu_device_s() {
    if !gpu_present("gpu_lane_views_equal_the_cpu_device_s") {
        return;
    }
    for (views, decode, share) in [
        (Views::dinov2().seed(5), Decode::Hybrid, Some(1.0)),
        (Views::simclr().seed(6), Decode::Hybrid, Some(0.5)),
        (Views::dinov2().seed(7), Decode::Cpu, None),
    ] {
        let make = |device| {
            let b = builder(views.clone(), device)
                .dtype(DType::F16)
                .batch_size(6);
            match (device, share) {
                (Device::Cpu, _) => b,
                (_, Some(share)) => b.decode(decode).gpu_share(share),
                (_, None) => b.decode(decode),
            }
            .build()
            .expect("build")
        };
        let (mut cpu, mut gpu) = (make(Device::Cpu), make(Device::Cuda(0)));
        let what = format!("{decode:?} share {share:?}");
        let on_gpu = same_batches(&mut cpu, &mut gpu, &what);
        match decode {
            Decode::Cpu => assert_eq!(on_gpu, 0, "{what}"),
            _ => assert!(on_gpu > 0, "{what}: the GPU lane made no views"),
        }
    }
}
