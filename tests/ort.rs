//! ONNX Runtime reads a batch in place (feature `ort`): a small model this test writes itself
//! (Cast, Mul, Add, ReduceMean, encoded as ONNX protobuf here) runs on the CPU execution
//! provider over batches of the CPU device, and its output equals the same computation done
//! directly on the batch. ONNX Runtime is loaded from `ORT_DYLIB_PATH` (the `libonnxruntime.so`
//! of the `onnxruntime` PyPI wheel; CI sets it); without it the test says it is skipped.

mod common;

use common::say_skipped;
use gpufeed::interop::ort::input;
use gpufeed::{DType, Device, Pipeline, Source, Tensor};
use ort::session::Session;

/// Protobuf wire format, as much as an ONNX model needs.
mod proto {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// A message under construction.
    #[derive(Default)]
    pub struct Message(Vec<u8>);

    impl Message {
        pub fn int(mut self, field: u64, v: i64) -> Self {
            varint(&mut self.0, field << 3);
            varint(&mut self.0, v as u64);
            self
        }

        pub fn bytes(mut self, field: u64, v: &[u8]) -> Self {
            varint(&mut self.0, (field << 3) | 2);
            varint(&mut self.0, v.len() as u64);
            self.0.extend_from_slice(v);
            self
        }

        pub fn str(self, field: u64, v: &str) -> Self {
            self.bytes(field, v.as_bytes())
        }

        pub fn msg(self, field: u64, v: Message) -> Self {
            self.bytes(field, &v.0)
        }

        pub fn into_bytes(self) -> Vec<u8> {
            self.0
        }
    }
}

use proto::Message;

const FLOAT: i64 = 1;
const FLOAT16: i64 = 10;

/// `ValueInfoProto` of a tensor with these dims (`Err` = a symbolic dim).
fn value_info(name: &str, elem_type: i64, dims: &[Result<i64, &str>]) -> Message {
    let shape = dims.iter().fold(Message::default(), |shape, d| {
        let dim = match d {
            Ok(v) => Message::default().int(1, *v),
            Err(param) => Message::default().str(2, param),
        };
        shape.msg(1, dim)
    });
    let tensor_type = Message::default().int(1, elem_type).msg(2, shape);
    Message::default()
        .str(1, name)
        .msg(2, Message::default().msg(1, tensor_type))
}

/// A float initializer `[1, 3, 1, 1]`.
fn channel_constant(name: &str, values: [f32; 3]) -> Message {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Message::default()
        .int(1, 1)
        .int(1, 3)
        .int(1, 1)
        .int(1, 1)
        .int(2, FLOAT)
        .str(8, name)
        .bytes(9, &raw)
}

fn node(op: &str, inputs: &[&str], output: &str, attributes: Vec<Message>) -> Message {
    let mut node = inputs
        .iter()
        .fold(Message::default(), |n, i| n.str(1, i))
        .str(2, output)
        .str(3, output)
        .str(4, op);
    for a in attributes {
        node = node.msg(5, a);
    }
    node
}

/// `means[n, c] = mean over h, w of (float(images[n, c, h, w]) * scale[c] + bias[c])`, for an
/// NCHW input of `elem_type`.
fn model(elem_type: i64, height: i64, width: i64, scale: [f32; 3], bias: [f32; 3]) -> Vec<u8> {
    const INT: i64 = 2;
    const INTS: i64 = 7;
    let cast_to_float = Message::default().str(1, "to").int(3, FLOAT).int(20, INT);
    let axes = Message::default()
        .str(1, "axes")
        .int(8, 2)
        .int(8, 3)
        .int(20, INTS);
    let keepdims = Message::default().str(1, "keepdims").int(3, 0).int(20, INT);
    let graph = Message::default()
        .msg(1, node("Cast", &["images"], "x", vec![cast_to_float]))
        .msg(1, node("Mul", &["x", "scale"], "scaled", vec![]))
        .msg(1, node("Add", &["scaled", "bias"], "shifted", vec![]))
        .msg(
            1,
            node("ReduceMean", &["shifted"], "means", vec![axes, keepdims]),
        )
        .str(2, "channel_means")
        .msg(5, channel_constant("scale", scale))
        .msg(5, channel_constant("bias", bias))
        .msg(
            11,
            value_info(
                "images",
                elem_type,
                &[Err("n"), Ok(3), Ok(height), Ok(width)],
            ),
        )
        .msg(12, value_info("means", FLOAT, &[Err("n"), Ok(3)]));
    let opset = Message::default().str(1, "").int(2, 13);
    Message::default()
        .int(1, 7)
        .str(2, "gpufeed-test")
        .msg(7, graph)
        .msg(8, opset)
        .into_bytes()
}

/// The model's computation done directly on the batch, in f64.
fn expected_means(images: &Tensor, scale: [f32; 3], bias: [f32; 3]) -> Vec<f64> {
    let host = images.as_host().expect("a host batch");
    let values = host.to_f32_vec();
    let &[n, c, h, w] = host.shape() else {
        panic!("a batch of images, not {:?}", host.shape())
    };
    let plane = h * w;
    (0..n * c)
        .map(|i| {
            let channel = i % c;
            let sum: f64 = values[i * plane..(i + 1) * plane]
                .iter()
                .map(|&x| (x * scale[channel] + bias[channel]) as f64)
                .sum();
            sum / plane as f64
        })
        .collect()
}

#[test]
fn onnx_runtime_reads_batches_in_place_and_computes_what_the_batch_says() {
    let Ok(library) = std::env::var("ORT_DYLIB_PATH") else {
        say_skipped(
            "onnx_runtime_reads_batches_in_place_and_computes_what_the_batch_says",
            "ORT_DYLIB_PATH is not set (the libonnxruntime.so of `pip install onnxruntime`)",
        );
        return;
    };
    let environment = ort::init_from(&library)
        .expect("load ONNX Runtime")
        .build()
        .expect("ONNX Runtime environment");
    let (scale, bias) = ([0.5f32, -2.0, 0.25], [1.0f32, 0.0, -3.5]);
    for (dtype, elem_type) in [(DType::F32, FLOAT), (DType::F16, FLOAT16)] {
        let bytes = model(elem_type, 224, 224, scale, bias);
        let mut session = Session::builder(&environment)
            .expect("session builder")
            .commit_from_memory(&bytes)
            .expect("the model loads");
        let mut pipeline = Pipeline::builder()
            .source(Source::directory(common::repo_path("assets")).expect("assets"))
            .batch_size(3)
            .dtype(dtype)
            .device(Device::Cpu)
            .build()
            .expect("pipeline");
        let mut batches = 0;
        while let Some(batch) = pipeline.next_batch().expect("batch") {
            let images = batch.images();
            let outputs = session
                .run(ort::inputs![input(images).expect("zero-copy input")])
                .expect("run");
            let (shape, got) = outputs["means"]
                .try_extract_tensor::<f32>()
                .expect("f32 output");
            assert_eq!(&**shape, &[batch.len() as i64, 3]);
            let want = expected_means(images, scale, bias);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{dtype:?} batch {batches} value {i}: ONNX Runtime {g}, direct {w}"
                );
            }
            batches += 1;
        }
        assert!(batches >= 2, "{dtype:?}: {batches} batches");
    }
}
