//! The patch server: a request's tokens and side tensors equal a pipeline's over the same images
//! bit for bit (bytes or paths, request after request through the same staging); bad images
//! fail the request by name, or are skipped and listed, and the server goes on serving; requests
//! over its budget and presets it cannot serve are refused. On a CUDA device the served tokens
//! equal the CPU device's, and those of the GPU decode lane the CPU threads' (skipped without
//! one, failing with `GPUFEED_REQUIRE_GPU=1`).

use std::path::PathBuf;

mod common;

use common::{gpu_present, repo_path};
use gpufeed::patches::Patches;
use gpufeed::{
    Batch, DType, Decode, DecodeOptions, Device, Error, OnError, PatchServer, Pipeline,
    RequestImage, Source, Tensor,
};

/// Photos and fixtures every serving preset takes: colour, gray, progressive and CMYK JPEGs,
/// PNGs with transparency, a palette and 16 bits, WebP, a 1-pixel image and a 10 x 600 column.
fn photos() -> Vec<PathBuf> {
    [
        "assets/rocket.jpg",
        "assets/chelsea.png",
        "assets/coffee.png",
        "tests/fixtures/gray.jpg",
        "tests/fixtures/progressive.jpg",
        "tests/fixtures/cmyk.jpg",
        "tests/fixtures/rgba.png",
        "tests/fixtures/palette.png",
        "tests/fixtures/rgb16.png",
        "tests/fixtures/one_pixel.png",
        "tests/fixtures/tall_10x600.png",
        "tests/fixtures/lossy.webp",
    ]
    .iter()
    .map(|p| repo_path(p))
    .collect()
}

/// The presets served, each with an element type: Qwen2-VL packed (its PIL and torchvision
/// processors), SigLIP2 padded with a mask.
fn presets() -> Vec<(Patches, DType)> {
    vec![
        (Patches::qwen2_vl().max_pixels(28 * 28 * 256), DType::F32),
        (
            Patches::qwen2_vl().max_pixels(28 * 28 * 128).torchvision(),
            DType::BF16,
        ),
        (Patches::siglip2_naflex().max_patches(196), DType::F16),
    ]
}

/// The bits of a tensor's values, widened, for exact comparisons.
fn bits(tensor: &Tensor) -> Vec<u64> {
    let host = tensor.to_host().expect("host");
    match host.data() {
        gpufeed::HostData::F32(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        gpufeed::HostData::F16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        gpufeed::HostData::BF16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        gpufeed::HostData::I32(v) => v.iter().map(|&x| x as u64).collect(),
        gpufeed::HostData::I64(v) => v.iter().map(|&x| x as u64).collect(),
        gpufeed::HostData::U8(v) => v.iter().map(|&x| u64::from(x)).collect(),
    }
}

/// What a consumer sees of a patch batch: the tokens' shape and bits, each image's plan, and
/// every side tensor (as vectors and as tensors on the batch's device).
#[derive(Debug, PartialEq)]
struct Seen {
    shape: Vec<usize>,
    tokens: Vec<u64>,
    plans: Vec<gpufeed::patches::PatchPlan>,
    grids: Vec<[i64; 3]>,
    cu_seqlens: Vec<i32>,
    mask: Vec<i32>,
    coordinates: Vec<[i64; 2]>,
    spatial_shapes: Vec<[i64; 2]>,
    tensors: Vec<(Vec<usize>, Vec<u64>)>,
}

fn seen(batch: &Batch) -> Seen {
    let info = batch.patches().expect("a patch batch");
    let tokens = batch.tokens().expect("tokens");
    let tensors = [
        info.cu_seqlens_tensor(),
        info.grids_tensor(),
        info.mask_tensor(),
        info.coordinates_tensor(),
        info.spatial_shapes_tensor(),
    ]
    .into_iter()
    .map(|t| {
        let t = t.expect("a side tensor");
        (t.shape().to_vec(), bits(&t))
    })
    .collect();
    Seen {
        shape: tokens.shape().to_vec(),
        tokens: bits(tokens),
        plans: info.plans().to_vec(),
        grids: info.grids(),
        cu_seqlens: info.cu_seqlens(),
        mask: info.mask(),
        coordinates: info.coordinates(),
        spatial_shapes: info.spatial_shapes(),
        tensors,
    }
}

fn server(patches: Patches, dtype: DType, device: Device) -> PatchServer {
    PatchServer::builder(patches)
        .device(device)
        .dtype(dtype)
        .max_images(16)
        .threads(2)
        .build()
        .expect("a server")
}

/// The one batch a CPU pipeline makes of `paths`.
fn pipeline_batch(paths: &[PathBuf], patches: Patches, dtype: DType) -> Batch {
    let mut pipeline = Pipeline::builder()
        .source(Source::paths(paths.to_vec()))
        .patches(patches)
        .batch_size(paths.len())
        .dtype(dtype)
        .device(Device::Cpu)
        .threads(2)
        .build()
        .expect("a pipeline");
    let batch = pipeline.next_batch().expect("a batch").expect("a batch");
    assert_eq!(batch.len(), paths.len(), "{:?}", batch.skipped());
    batch
}

/// For every preset: the server's batch of the photos, as paths and as bytes, equals the
/// pipeline's bit for bit; a smaller request served in between (other sizes in the same
/// staging) and the same request again change nothing.
#[test]
fn served_batches_equal_the_pipeline_s() {
    let paths = photos();
    let bytes: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).expect("a fixture"))
        .collect();
    for (patches, dtype) in presets() {
        let want = pipeline_batch(&paths, patches, dtype);
        let mut server = server(patches, dtype, Device::Cpu);
        let as_paths: Vec<RequestImage<'_>> = paths.iter().map(RequestImage::from).collect();
        let as_bytes: Vec<RequestImage<'_>> = bytes.iter().map(RequestImage::from).collect();
        let by_path = server.serve(&as_paths).expect("served");
        assert_eq!(by_path.ids(), want.ids());
        assert_eq!(seen(&by_path), seen(&want), "{:?} {dtype}", patches.preset);
        let small = server.serve(&as_bytes[3..5]).expect("served");
        assert_eq!(
            small.ids(),
            ["image 0 of the request", "image 1 of the request"]
        );
        assert_eq!(
            seen(&small),
            seen(&pipeline_batch(&paths[3..5], patches, dtype))
        );
        let by_bytes = server.serve(&as_bytes).expect("served");
        assert_eq!(by_bytes.indices(), (0..paths.len()).collect::<Vec<_>>());
        assert_eq!(seen(&by_bytes), seen(&want), "{:?} {dtype}", patches.preset);
    }
}

/// A bad image fails its request with an error naming it and saying why; the server then serves
/// the next request as if nothing had happened. Skipping, the good images are served and the
/// bad ones listed.
#[test]
fn bad_images_are_named_and_the_server_goes_on() {
    let patches = Patches::qwen2_vl().max_pixels(28 * 28 * 64);
    let mut server = server(patches, DType::F32, Device::Cpu);
    let photo = std::fs::read(repo_path("assets/rocket.jpg")).expect("a photo");
    let missing = repo_path("tests/fixtures/no-such-file.jpg");
    let wide = repo_path("tests/fixtures/wide_4000x10.png");
    let good = server
        .serve(&[RequestImage::Bytes(&photo)])
        .expect("served");
    let cases: Vec<(Vec<RequestImage<'_>>, String, &str)> = vec![
        (
            vec![
                RequestImage::Bytes(&photo),
                RequestImage::Bytes(&photo),
                RequestImage::Bytes(b"not an image"),
            ],
            "image 2 of the request: ".into(),
            "not a JPEG",
        ),
        (
            vec![RequestImage::Bytes(&photo), RequestImage::Path(&missing)],
            format!("{}: ", missing.display()),
            "",
        ),
        (
            vec![RequestImage::Path(&wide)],
            format!("{}: ", wide.display()),
            "aspect ratio",
        ),
        (
            vec![RequestImage::Bytes(&photo[..100])],
            "image 0 of the request: ".into(),
            "",
        ),
    ];
    for (request, prefix, reason) in cases {
        let e = server.serve(&request).expect_err("a bad image");
        assert!(matches!(e, Error::Item(_)), "{e:?}");
        let text = e.to_string();
        assert!(text.starts_with(&prefix), "{text}");
        assert!(text.contains(reason), "{text}");
        let again = server
            .serve(&[RequestImage::Bytes(&photo)])
            .expect("served");
        assert_eq!(seen(&again), seen(&good));
    }
    let mut skipping = PatchServer::builder(patches)
        .device(Device::Cpu)
        .dtype(DType::F32)
        .on_error(OnError::Skip)
        .build()
        .expect("a server");
    let batch = skipping
        .serve(&[
            RequestImage::Bytes(b"not an image"),
            RequestImage::Bytes(&photo),
            RequestImage::Path(&wide),
        ])
        .expect("served");
    assert_eq!(batch.indices(), [1]);
    assert_eq!(batch.ids(), ["image 1 of the request"]);
    let skipped: Vec<&str> = batch.skipped().iter().map(|e| e.id.as_str()).collect();
    assert_eq!(skipped.len(), 2);
    assert_eq!(skipped[0], "image 0 of the request");
    assert_eq!(seen(&batch).tokens, seen(&good).tokens);
    let e = skipping
        .serve(&[RequestImage::Bytes(b"not an image")])
        .expect_err("nothing to serve");
    assert!(e.to_string().starts_with("image 0 of the request: "), "{e}");
}

fn invalid_option(e: Error) -> &'static str {
    match e {
        Error::InvalidOption { option, .. } => option,
        other => panic!("an invalid option, not {other:?}"),
    }
}

/// Requests over the server's budget, empty requests, a training preset and a budget of
/// nothing are refused, each naming the option.
#[test]
fn requests_over_the_budget_and_unservable_presets_are_refused() {
    let photo = std::fs::read(repo_path("assets/rocket.jpg")).expect("a photo");
    let patches = Patches::qwen2_vl().max_pixels(28 * 28 * 64);
    let mut small = PatchServer::builder(patches)
        .device(Device::Cpu)
        .max_images(2)
        .max_tokens(100)
        .build()
        .expect("a server");
    assert_eq!((small.max_images(), small.max_tokens()), (2, 100));
    let three = [RequestImage::Bytes(&photo); 3];
    assert_eq!(
        invalid_option(small.serve(&three).expect_err("3 > 2")),
        "max_images"
    );
    assert_eq!(
        invalid_option(small.serve(&[]).expect_err("none")),
        "max_images"
    );
    let e = small.serve(&three[..1]).expect_err("over 100 tokens");
    assert!(
        e.to_string().contains("tokens, over the server's 100"),
        "{e}"
    );
    assert_eq!(invalid_option(e), "max_tokens");
    let refused = |b: gpufeed::PatchServerBuilder| invalid_option(b.build().expect_err("refused"));
    let cpu = |p: Patches| PatchServer::builder(p).device(Device::Cpu);
    assert_eq!(refused(cpu(Patches::timm_naflex())), "patches");
    assert_eq!(refused(cpu(patches).max_images(0)), "max_images");
    assert_eq!(
        refused(cpu(Patches::qwen2_vl().max_pixels(10))),
        "max_pixels"
    );
    assert_eq!(refused(cpu(patches).dtype(DType::I32)), "dtype");
}

/// On a CUDA device, request after request (the staging's two slots in turn, each response's
/// memory poisoned with NaN once read, so the next one allocated in its place shows any value
/// the kernel left unwritten), the served tokens and side tensors equal the CPU device's.
#[test]
fn served_tokens_on_the_gpu_equal_the_cpu_device_s() {
    if !gpu_present("served_tokens_on_the_gpu_equal_the_cpu_device_s") {
        return;
    }
    let paths = photos();
    let requests: Vec<Vec<RequestImage<'_>>> = vec![
        paths.iter().map(RequestImage::from).collect(),
        paths[..1].iter().map(RequestImage::from).collect(),
        paths[2..9].iter().map(RequestImage::from).collect(),
        paths.iter().rev().map(RequestImage::from).collect(),
    ];
    for (patches, dtype) in presets() {
        let mut cpu = server(patches, dtype, Device::Cpu);
        let mut gpu = server(patches, dtype, Device::Cuda(0));
        assert!(gpu.cuda_stream().is_some());
        for request in &requests {
            let want = seen(&cpu.serve(request).expect("served on the CPU"));
            let batch = gpu.serve(request).expect("served on the GPU");
            // The CPU threads' images go up; the GPU lane's are decoded in place.
            let (cpu_rows, gpu_rows) = batch.decoded_by();
            assert_eq!(cpu_rows + gpu_rows, batch.len());
            assert!(cpu_rows == 0 || batch.uploaded_bytes() > 0);
            assert_eq!(seen(&batch), want, "{:?} {dtype}", patches.preset);
            poison(batch);
        }
    }
}

/// Fills the tokens' memory with all bits set before it goes back to the pool.
fn poison(batch: Batch) {
    let gpufeed::Tensor::Device(tokens) = batch.into_images() else {
        panic!("tokens on the device")
    };
    let stream = tokens.stream().clone();
    let poisoned = match tokens.into_data().expect("the tokens' memory") {
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
    poisoned.expect("poisoning the tokens");
}

/// A request the GPU decode lane and the CPU threads share: a JPEG of about a megapixel (4:4:4
/// baseline, 528 kB), a small baseline JPEG, a PNG and a progressive JPEG.
fn mixed_request() -> Vec<PathBuf> {
    [
        "assets/hubble_deep_field.jpg",
        "assets/rocket.jpg",
        "assets/coffee.png",
        "tests/fixtures/progressive.jpg",
    ]
    .iter()
    .map(|p| repo_path(p))
    .collect()
}

/// A request's tokens and side tensors as seen, or its error in words.
fn outcome(served: gpufeed::Result<Batch>) -> Result<(Seen, (usize, usize)), String> {
    served
        .map(|batch| (seen(&batch), batch.decoded_by()))
        .map_err(|e| e.to_string())
}

/// On the CPU device the CPU threads decode every image, whatever the decode option says, and
/// say so; the tokens do not depend on it.
#[test]
fn a_cpu_device_server_decodes_on_the_cpu_threads() {
    let paths = mixed_request();
    let request: Vec<RequestImage<'_>> = paths.iter().map(RequestImage::from).collect();
    let patches = Patches::qwen2_vl().max_pixels(28 * 28 * 256);
    let mut any = server(patches, DType::F32, Device::Cpu);
    let mut asked = PatchServer::builder(patches)
        .device(Device::Cpu)
        .dtype(DType::F32)
        .decode(DecodeOptions::default().lanes(Decode::Cpu))
        .threads(2)
        .build()
        .expect("a server");
    assert_eq!(
        any.decode_description(),
        "CPU decode, as the tokens go to the CPU"
    );
    assert_eq!(asked.decode_description(), any.decode_description());
    let batch = any.serve(&request).expect("served");
    assert_eq!(batch.decoded_by(), (4, 0));
    assert_eq!(outcome(Ok(batch)), outcome(asked.serve(&request)));
    // Hybrid decoding asks for a CUDA device.
    let hybrid = PatchServer::builder(patches)
        .device(Device::Cpu)
        .decode(DecodeOptions::default().lanes(Decode::Hybrid))
        .build()
        .expect_err("hybrid decoding on the CPU device");
    assert_eq!(invalid_option(hybrid), "decode");
}

/// On a CUDA device the GPU decode lane (opened at build) decodes the JPEGs of a request (its
/// assisted path: libjpeg-turbo's arithmetic on the GPU) and the CPU threads the others, in one
/// batch in request order: the tokens and side tensors equal, bit for bit, those of a server
/// decoding every image on the CPU threads, request after request (each response's memory
/// poisoned once read), for Qwen2-VL and SigLIP2 at their defaults; `decoded_by` counts each
/// lane's images; a bad image fails its request by name as on the CPU threads (or is skipped),
/// and the server goes on.
#[test]
fn served_on_the_gpu_decode_lane_equal_the_cpu_threads_bytes() {
    if !gpu_present("served_on_the_gpu_decode_lane_equal_the_cpu_threads_bytes") {
        return;
    }
    let paths = mixed_request();
    let bytes: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).expect("a fixture"))
        .collect();
    let as_bytes: Vec<RequestImage<'_>> = bytes.iter().map(RequestImage::from).collect();
    let as_paths: Vec<RequestImage<'_>> = paths.iter().map(RequestImage::from).collect();
    let large = &bytes[0];
    let truncated = &large[..large.len() / 2];
    let requests: Vec<Vec<RequestImage<'_>>> = vec![
        as_bytes.clone(),
        as_paths.clone(),
        as_bytes.iter().rev().copied().collect(),
        vec![RequestImage::Bytes(large)],
        vec![as_bytes[2]],
        vec![as_bytes[0], as_bytes[1], as_bytes[0], as_bytes[3]],
    ];
    for patches in [Patches::qwen2_vl(), Patches::siglip2_naflex()] {
        let build = |decode: Decode, on_error: OnError| {
            PatchServer::builder(patches)
                .device(Device::Cuda(0))
                .dtype(DType::F32)
                .max_images(8)
                .decode(DecodeOptions::default().lanes(decode))
                .on_error(on_error)
                .build()
                .expect("a server")
        };
        let mut cpu = build(Decode::Cpu, OnError::Fail);
        let mut gpu = build(Decode::Auto, OnError::Fail);
        let described = gpu.decode_description();
        println!("{:?}: {described}", patches.preset);
        assert!(described.starts_with("GPU decode"), "{described}");
        assert_eq!(cpu.decode_description(), "CPU decode, as asked");
        let mut by_gpu = 0;
        for request in &requests {
            let want = cpu.serve(request).expect("served on the CPU threads");
            let (want_seen, want_by) = (seen(&want), want.decoded_by());
            poison(want);
            assert_eq!(want_by, (request.len(), 0));
            let got = gpu.serve(request).expect("served with the GPU lane");
            let (cpu_images, gpu_images) = got.decoded_by();
            assert_eq!(cpu_images + gpu_images, request.len());
            by_gpu += gpu_images;
            assert_eq!(seen(&got), want_seen, "{:?}", patches.preset);
            poison(got);
        }
        // The PNG is the CPU threads'; the baseline JPEGs the GPU lane's (the progressive one
        // too, unless its assisted path hands it back).
        let mixed = gpu.serve(&as_bytes).expect("served").decoded_by();
        assert!(
            mixed.0 >= 1 && mixed.1 >= 2 && mixed.0 + mixed.1 == 4,
            "{mixed:?}"
        );
        assert_eq!(
            gpu.serve(&[as_bytes[0]]).expect("served").decoded_by(),
            (0, 1)
        );
        assert_eq!(
            gpu.serve(&[as_bytes[2]]).expect("served").decoded_by(),
            (1, 0)
        );
        assert!(by_gpu > 0, "the GPU lane decoded none");
        // Bad images: named as the CPU threads name them; the server goes on.
        let bad: Vec<Vec<RequestImage<'_>>> = vec![
            vec![
                as_bytes[0],
                RequestImage::Bytes(b"not an image"),
                as_bytes[2],
            ],
            vec![as_bytes[1], RequestImage::Bytes(truncated)],
            vec![RequestImage::Bytes(&large[..100]), as_bytes[0]],
        ];
        for request in &bad {
            let want = outcome(cpu.serve(request));
            assert_eq!(outcome(gpu.serve(request)).map(|o| o.0), want.map(|o| o.0));
            let again = gpu.serve(&as_bytes).expect("served after a bad request");
            assert_eq!(seen(&again), seen(&cpu.serve(&as_bytes).expect("served")));
        }
        let e = gpu.serve(&bad[0]).expect_err("not an image");
        assert!(matches!(e, Error::Item(_)), "{e:?}");
        assert!(e.to_string().starts_with("image 1 of the request: "), "{e}");
        let mut skipping = build(Decode::Auto, OnError::Skip);
        let batch = skipping.serve(&bad[0]).expect("served");
        assert_eq!(batch.indices(), [0, 2]);
        assert_eq!(batch.decoded_by().0 + batch.decoded_by().1, 2);
        assert_eq!(batch.skipped()[0].id, "image 1 of the request");
    }
}
