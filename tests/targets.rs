//! Dense targets through the public API: bad targets each give their documented result (an
//! object dropped by `SanitizeBoundingBoxes`, a sample skipped with its reason, an annotation
//! left out and counted), never a panic; batches are the same whatever the thread count and
//! however many are made ahead.

use std::path::Path;

use gpufeed::targets::{TargetLoader, TargetRecipe, TargetSource};
use gpufeed::ItemErrorKind;

fn write_jpeg(path: &Path, w: u32, h: u32) {
    // Gradients with noise, so resampling shows in every byte.
    let noise = |x: u32, y: u32| (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)) >> 27;
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            (x * 7 + noise(x, y)) as u8,
            (y * 5) as u8,
            (99 + noise(y, x)) as u8,
        ])
    });
    img.save(path).unwrap();
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufeed-targets-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const COCO: &str = r#"{
  "images": [
    {"id": 1, "file_name": "a.jpg", "width": 40, "height": 30},
    {"id": 2, "file_name": "missing.jpg", "width": 40, "height": 30},
    {"id": 3, "file_name": "b.jpg", "width": 40, "height": 30},
    {"id": 4, "file_name": "c.jpg", "width": 40, "height": 30},
    {"id": 5, "file_name": "d.jpg", "width": 40, "height": 30}],
  "annotations": [
    {"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 10, 10],
     "segmentation": [[2, 2, 12, 2, 12, 12]]},
    {"id": 2, "image_id": 1, "category_id": 1, "bbox": [50, 50, 10, 10]},
    {"id": 3, "image_id": 1, "category_id": 1, "bbox": [5, 5, 0, 4]},
    {"id": 4, "image_id": 3, "category_id": 1, "bbox": [1, 1, 5, 5],
     "segmentation": {"size": [30, 40], "counts": [5, 10, 5]}},
    {"id": 5, "image_id": 4, "category_id": 1, "bbox": [1, 1, 5, 5],
     "segmentation": [[1, 1, 5, 5]]},
    {"id": 6, "image_id": 5, "category_id": 1, "bbox": [1, 1, 5, 5],
     "segmentation": {"size": [20, 40], "counts": [5, 10, 785]}},
    {"id": 7, "image_id": 9, "category_id": 1, "bbox": [1, 1, 5, 5]},
    {"id": 8, "image_id": 1, "category_id": 77, "bbox": [1, 1, 5, 5]}],
  "categories": [{"id": 1, "name": "thing"}]}"#;

#[test]
fn bad_coco_targets_have_their_documented_results() {
    let dir = temp("coco");
    for name in ["a.jpg", "b.jpg", "c.jpg", "d.jpg"] {
        write_jpeg(&dir.join(name), 40, 30);
    }
    let ann = dir.join("ann.json");
    std::fs::write(&ann, COCO).unwrap();
    let source = TargetSource::coco(&ann, &dir).unwrap();
    let report = source.coco_file().unwrap().report;
    assert_eq!(report.orphan_annotations, 1, "annotation of image 9");
    assert_eq!(report.unknown_categories, 1, "category 77");
    let mut loader = TargetLoader::new(source).batch_size(16);
    let batch = loader.next_batch().unwrap();
    assert!(loader.next_batch().is_none());
    // a.jpg only: its box outside the image and its zero-width box dropped by Sanitize.
    assert_eq!(batch.len(), 1);
    assert_eq!(batch.row_boxes(0), &[[2.0, 2.0, 12.0, 12.0]]);
    assert_eq!(
        batch.masks.len(),
        64 * 32,
        "one mask plane of the padded size"
    );
    let report = loader.report();
    assert_eq!(report.dropped_objects, 2);
    let reasons: Vec<String> = report.skipped.iter().map(|e| e.to_string()).collect();
    assert_eq!(report.skipped.len(), 4, "{reasons:#?}");
    let find = |needle: &str| {
        report
            .skipped
            .iter()
            .find(|e| e.id.ends_with(needle))
            .unwrap_or_else(|| panic!("{needle} not skipped: {reasons:#?}"))
    };
    assert!(matches!(
        find("missing.jpg").kind,
        ItemErrorKind::Read { .. }
    ));
    let b = find("b.jpg").kind.to_string();
    assert!(b.contains("add up to 20 pixels, the mask has 1200"), "{b}");
    let c = find("c.jpg").kind.to_string();
    assert!(c.contains("polygon of 4 numbers"), "{c}");
    let d = find("d.jpg").kind.to_string();
    assert!(d.contains("mask of 40x20, the image is 40x30"), "{d}");
}

#[test]
fn a_file_that_is_not_coco_names_itself() {
    let dir = temp("notcoco");
    let ann = dir.join("ann.json");
    std::fs::write(&ann, "{\"images\": [{\"id\": 1}]}").unwrap();
    let e = TargetSource::coco(&ann, &dir).unwrap_err().to_string();
    assert!(
        e.contains("ann.json") && e.contains("malformed image"),
        "{e}"
    );
    std::fs::write(&ann, "[1, 2").unwrap();
    let e = TargetSource::coco(&ann, &dir).unwrap_err().to_string();
    assert!(e.contains("ann.json") && e.contains("not COCO JSON"), "{e}");
}

fn write_mask(path: &Path, w: u32, h: u32) {
    let file = std::fs::File::create(path).unwrap();
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Indexed);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_palette(vec![0u8; 3 * 256]);
    let mut writer = enc.write_header().unwrap();
    let data: Vec<u8> = (0..w * h).map(|i| (i % 21) as u8).collect();
    writer.write_image_data(&data).unwrap();
}

#[test]
fn bad_segmentation_pairs_are_skipped_with_their_reason() {
    let dir = temp("seg");
    let (images, masks) = (dir.join("images"), dir.join("masks"));
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(&masks).unwrap();
    for name in ["a", "b", "c"] {
        write_jpeg(&images.join(format!("{name}.jpg")), 50, 40);
    }
    write_mask(&masks.join("a.png"), 50, 40);
    write_mask(&masks.join("b.png"), 40, 40);
    let source = TargetSource::segmentation(&images, &masks).unwrap();
    let mut loader = TargetLoader::new(source)
        .recipe(TargetRecipe::SegmentationEval)
        .size_divisible(1);
    let batch = loader.next_batch().unwrap();
    assert_eq!(batch.len(), 1);
    // Resize(520) of 50x40: 650x520; the mask's palette indices are kept (nearest).
    assert_eq!((batch.width, batch.height), (650, 520));
    assert!(batch.semantic.iter().all(|&v| v < 21));
    assert!(batch.semantic.contains(&20));
    let reasons: Vec<String> = loader
        .report()
        .skipped
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:#?}");
    assert!(reasons
        .iter()
        .any(|r| r.contains("b.jpg") && r.contains("is 40x40, its image 50x40")));
    assert!(reasons
        .iter()
        .any(|r| r.contains("c.jpg") && r.contains("c.png")));
}

#[test]
fn batches_do_not_depend_on_the_thread_count() {
    let dir = temp("threads");
    let mut images = Vec::new();
    let mut annotations = Vec::new();
    for i in 0..6u32 {
        let (w, h) = (30 + 17 * i, 60 - 5 * i);
        write_jpeg(&dir.join(format!("{i}.jpg")), w, h);
        images.push(format!(
            r#"{{"id": {i}, "file_name": "{i}.jpg", "width": {w}, "height": {h}}}"#
        ));
        annotations.push(format!(
            r#"{{"id": {i}, "image_id": {i}, "category_id": 1, "bbox": [1, 2, 20, 15],
                "segmentation": [[1, 2, 21, 2, 21, 17, 1, 17]]}}"#
        ));
    }
    let ann = dir.join("ann.json");
    std::fs::write(
        &ann,
        format!(
            r#"{{"images": [{}], "annotations": [{}], "categories": [{{"id": 1}}]}}"#,
            images.join(","),
            annotations.join(",")
        ),
    )
    .unwrap();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut loader = TargetLoader::new(TargetSource::coco(&ann, &dir).unwrap())
                .recipe(TargetRecipe::Lsj)
                .seed(5)
                .shuffle(true)
                .batch_size(4);
            let mut out = Vec::new();
            while let Some(b) = loader.next_batch() {
                out.push((b.indices, b.images, b.boxes, b.masks, b.ops));
            }
            out
        })
    };
    let one = run(1);
    assert_eq!(one.len(), 2);
    assert_eq!(one, run(3));

    // Resumed after the first batch of epoch 1: the same second batch.
    let loader = || {
        TargetLoader::new(TargetSource::coco(&ann, &dir).unwrap())
            .recipe(TargetRecipe::Lsj)
            .seed(5)
            .shuffle(true)
            .batch_size(4)
    };
    let mut first = loader();
    while first.next_batch().is_some() {}
    first.next_epoch();
    first.next_batch().unwrap();
    let (epoch, position) = first.position();
    assert_eq!((epoch, position), (1, 4));
    let want = first.next_batch().unwrap();
    let got = loader().resume_at(epoch, position).next_batch().unwrap();
    assert_eq!(
        (got.indices, got.images, got.ops),
        (want.indices, want.images, want.ops)
    );
}

/// A COCO set of `n` images of varied sizes with polygon and RLE objects under `dir`.
fn varied_coco(dir: &Path, n: u32) -> std::path::PathBuf {
    let (mut images, mut annotations) = (Vec::new(), Vec::new());
    for i in 0..n {
        let (w, h) = (23 + 41 * (i % 5), 90 - 13 * (i % 4));
        write_jpeg(&dir.join(format!("{i}.jpg")), w, h);
        images.push(format!(
            r#"{{"id": {i}, "file_name": "{i}.jpg", "width": {w}, "height": {h}}}"#
        ));
        let (x, y) = (i % 7, i % 5);
        annotations.push(format!(
            r#"{{"id": {}, "image_id": {i}, "category_id": 1, "bbox": [{x}, {y}, 15, 12],
                "segmentation": [[{x}, {y}, {}, {y}, {}, {}]]}}"#,
            2 * i,
            x + 15,
            x + 7,
            y + 12
        ));
        let runs = [w * 3 + 2, w * 4, h * w - w * 7 - 2];
        annotations.push(format!(
            r#"{{"id": {}, "image_id": {i}, "category_id": 2, "bbox": [3, 2, 4, 9],
                "segmentation": {{"size": [{h}, {w}], "counts": {runs:?}}}}}"#,
            2 * i + 1
        ));
    }
    let ann = dir.join("ann.json");
    std::fs::write(
        &ann,
        format!(
            r#"{{"images": [{}], "annotations": [{}], "categories": [{{"id": 1}}, {{"id": 2}}]}}"#,
            images.join(","),
            annotations.join(",")
        ),
    )
    .unwrap();
    ann
}

/// Each row of `batch` against its sample loaded and transformed whole (`Sample::apply`), laid
/// in the top-left corner of the padded planes, the padding `pad` (images), 0 (instance masks)
/// and 255 (semantic masks).
fn check_rows_against_whole(source: &TargetSource, batch: &gpufeed::targets::TargetBatch, pad: u8) {
    let (hu, wu) = (batch.height as usize, batch.width as usize);
    for (row, &index) in batch.indices.iter().enumerate() {
        let mut s = source.load(index, &Default::default()).unwrap();
        s.apply(&batch.ops[row]).unwrap();
        let (h, w) = (s.height as usize, s.width as usize);
        assert_eq!(batch.sizes[row], (s.height, s.width));
        assert_eq!(batch.row_boxes(row), &s.boxes[..], "row {row}");
        let image = &batch.images[row * hu * wu * 3..(row + 1) * hu * wu * 3];
        for y in 0..hu {
            let got = &image[y * wu * 3..(y + 1) * wu * 3];
            if y < h {
                assert_eq!(
                    &got[..w * 3],
                    &s.pixels[y * w * 3..(y + 1) * w * 3],
                    "row {row} y {y} {:?}",
                    batch.ops[row]
                );
                assert!(got[w * 3..].iter().all(|&v| v == pad));
            } else {
                assert!(got.iter().all(|&v| v == pad));
            }
        }
        let mut planes: Vec<(&[u8], &[u8], u8)> = Vec::new();
        let first = batch.offsets[row];
        for p in 0..s.masks.count {
            let got = &batch.masks[(first + p) * hu * wu..(first + p + 1) * hu * wu];
            planes.push((got, &s.masks.data[p * h * w..(p + 1) * h * w], 0));
        }
        if s.semantic.count > 0 {
            planes.push((
                &batch.semantic[row * hu * wu..(row + 1) * hu * wu],
                &s.semantic.data,
                255,
            ));
        }
        for (got, want, fill) in planes {
            for y in 0..hu {
                let g = &got[y * wu..(y + 1) * wu];
                if y < h {
                    assert_eq!(&g[..w], &want[y * w..(y + 1) * w], "row {row} mask y {y}");
                    assert!(g[w..].iter().all(|&v| v == fill));
                } else {
                    assert!(g.iter().all(|&v| v == fill));
                }
            }
        }
    }
}

#[test]
fn batches_equal_each_sample_transformed_whole() {
    let dir = temp("whole");
    let ann = varied_coco(&dir, 10);
    let recipes = [
        TargetRecipe::Plain,
        TargetRecipe::Hflip,
        TargetRecipe::Lsj,
        TargetRecipe::Multiscale,
        TargetRecipe::Ssd,
        TargetRecipe::Ssdlite,
        TargetRecipe::Letterbox {
            width: 96,
            height: 64,
            fill: 114,
        },
    ];
    for recipe in recipes {
        for seed in 0..3 {
            let mut loader = TargetLoader::new(TargetSource::coco(&ann, &dir).unwrap())
                .recipe(recipe)
                .seed(seed)
                .pad_fill(7)
                .batch_size(4);
            while let Some(batch) = loader.next_batch() {
                assert!(batch.skipped.is_empty(), "{:?}", batch.skipped);
                check_rows_against_whole(loader.source(), &batch, 7);
                // The buffers come back poisoned: the next batch must write every byte.
                let mut spent = batch;
                spent.images.fill(0xAB);
                spent.masks.fill(0xAB);
                loader.recycle(spent);
            }
        }
    }
    let (images, masks) = (dir.join("seg-images"), dir.join("seg-masks"));
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(&masks).unwrap();
    for i in 0..6u32 {
        let (w, h) = (31 + 29 * i, 70 - 9 * i);
        write_jpeg(&images.join(format!("{i}.jpg")), w, h);
        write_mask(&masks.join(format!("{i}.png")), w, h);
    }
    for recipe in [
        TargetRecipe::SegmentationTrain,
        TargetRecipe::SegmentationEval,
    ] {
        let mut loader = TargetLoader::new(TargetSource::segmentation(&images, &masks).unwrap())
            .recipe(recipe)
            .seed(1)
            .batch_size(3);
        while let Some(batch) = loader.next_batch() {
            check_rows_against_whole(loader.source(), &batch, 0);
            let mut spent = batch;
            spent.images.fill(0xAB);
            spent.semantic.fill(0xAB);
            loader.recycle(spent);
        }
    }
}

/// Whether a CUDA device is usable; without one the test says `skipped: no CUDA device` and
/// passes, unless `GPUFEED_REQUIRE_GPU=1`.
fn gpu_present(test: &str) -> bool {
    match gpufeed::cuda::probe() {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var("GPUFEED_REQUIRE_GPU").as_deref() != Ok("1"),
                "GPUFEED_REQUIRE_GPU=1 but {e}"
            );
            eprintln!("skipped: {test}: no CUDA device ({e})");
            false
        }
    }
}

/// Every device batch against the host batch of the same loader options, normalized on the host
/// with the same affine (one `f32` fused multiply-add a value, as the kernel): images bit for
/// bit (padding included), masks and semantic masks byte for byte, targets equal. Three times:
/// one batch made ahead, the JPEGs decoded on the CPU (the first batch made while the device
/// opens and copied into staging memory, the others laid out in page-locked memory); the
/// default (a small set all made at once), the JPEGs decoded by the device's decoders (open
/// before the first batch); and the default with the decoders opening beside the first
/// batches. Returns the rows the device decoded in the second.
fn check_device_batches(make: &dyn Fn() -> TargetLoader, output: gpufeed::OutputOptions) -> usize {
    check_device_batches_ahead(make, output, (Some(1), gpufeed::Decode::Cpu));
    check_device_batches_ahead(make, output, (None, gpufeed::Decode::Auto));
    check_device_batches_ahead(make, output, (None, gpufeed::Decode::Hybrid))
}

fn check_device_batches_ahead(
    make: &dyn Fn() -> TargetLoader,
    output: gpufeed::OutputOptions,
    (prefetch, lanes): (Option<usize>, gpufeed::Decode),
) -> usize {
    let mut host = make();
    let mut device = make()
        .device(gpufeed::Device::Cuda(0))
        .output(output)
        .decode_lanes(lanes);
    if let Some(n) = prefetch {
        device = device.prefetch(n);
    }
    let affine = output.affine();
    let mut batches = 0;
    while let Some(want) = host.next_batch() {
        let got = device
            .next_device_batch()
            .expect("a device batch")
            .expect("device batch");
        let (n, h, w) = (want.len(), want.height as usize, want.width as usize);
        assert_eq!(got.images.shape(), &[n, 3, h, w]);
        let images = got.images.to_host().expect("download").to_f32_vec();
        for i in 0..n {
            for c in 0..3 {
                for p in 0..h * w {
                    let x = want.images[(i * h * w + p) * 3 + c];
                    let v = affine.apply(c, x);
                    let v = match output.dtype {
                        gpufeed::DType::F16 => gpufeed::half::f16::from_f32(v).to_f32(),
                        gpufeed::DType::BF16 => gpufeed::half::bf16::from_f32(v).to_f32(),
                        _ => v,
                    };
                    let g = images[((i * 3 + c) * h * w) + p];
                    assert_eq!(g.to_bits(), v.to_bits(), "row {i} channel {c} pixel {p}");
                }
            }
        }
        let bytes = |t: &Option<gpufeed::DeviceTensor>| -> Vec<u8> {
            match t.as_ref().map(|t| t.to_host().expect("download")) {
                Some(h) => match h.data() {
                    gpufeed::HostData::U8(v) => v[..h.len()].to_vec(),
                    other => panic!("masks of {:?}", other.dtype()),
                },
                None => Vec::new(),
            }
        };
        let masks = bytes(&got.masks);
        assert_eq!(masks.len(), want.masks.len());
        assert!(masks == want.masks, "instance masks differ");
        assert!(
            bytes(&got.semantic) == want.semantic,
            "semantic masks differ"
        );
        assert_eq!(got.targets.boxes, want.boxes);
        assert_eq!(got.targets.offsets, want.offsets);
        assert_eq!(got.targets.ops, want.ops);
        batches += 1;
    }
    assert!(device.next_device_batch().is_none());
    assert!(batches > 1);
    let decoded = device.report().decoded_on_device;
    if lanes == gpufeed::Decode::Cpu {
        assert_eq!(decoded, 0);
    }
    decoded
}

#[test]
fn device_batches_equal_the_host_batch_normalized() {
    if !gpu_present("device_batches_equal_the_host_batch_normalized") {
        return;
    }
    let dir = temp("device");
    let ann = varied_coco(&dir, 9);
    let coco = || {
        TargetLoader::new(TargetSource::coco(&ann, &dir).unwrap())
            .recipe(TargetRecipe::Lsj)
            .seed(2)
            .batch_size(4)
    };
    let detection = gpufeed::targets::detection_output();
    assert_eq!(coco().default_output(), detection);
    // Every row of `lsj` is placed by the device, so every JPEG goes to its decoders.
    assert_eq!(check_device_batches(&coco, detection), 9);
    check_device_batches(&coco, detection.dtype(gpufeed::DType::BF16));
    // Every recipe: resized, cut, padded (in the batch's padding colour or another) and
    // mirrored on the device, or laid out on the host where the device cannot place a row.
    for recipe in [
        TargetRecipe::Plain,
        TargetRecipe::Hflip,
        TargetRecipe::Multiscale,
        TargetRecipe::Ssd,
        TargetRecipe::Ssdlite,
        TargetRecipe::SegmentationTrain,
        TargetRecipe::SegmentationEval,
        TargetRecipe::Letterbox {
            width: 96,
            height: 70,
            fill: 114,
        },
    ] {
        for seed in [3, 4] {
            let make = || {
                TargetLoader::new(TargetSource::coco(&ann, &dir).unwrap())
                    .recipe(recipe)
                    .seed(seed)
                    .shuffle(true)
                    .batch_size(3)
                    .size_divisible(if seed == 3 { 32 } else { 1 })
            };
            check_device_batches(&make, detection);
        }
    }
    // The same from WebDataset shards: instance masks uploaded as from the COCO file.
    let shards = coco_as_shards(&dir, &ann, 9, 4);
    let wds = || {
        let source = TargetSource::webdataset(&shards, gpufeed::targets::TargetKind::Instances);
        TargetLoader::new(source.unwrap())
            .recipe(TargetRecipe::Lsj)
            .seed(2)
            .batch_size(4)
    };
    assert_eq!(wds().default_output(), detection);
    check_device_batches(&wds, detection);
    let (images, masks) = (dir.join("seg-images"), dir.join("seg-masks"));
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(&masks).unwrap();
    for i in 0..5u32 {
        let (w, h) = (31 + 29 * i, 70 - 9 * i);
        write_jpeg(&images.join(format!("{i}.jpg")), w, h);
        write_mask(&masks.join(format!("{i}.png")), w, h);
    }
    // A gray JPEG: one plane, which the device spreads to three channels as the CPU does.
    let gray = image::GrayImage::from_fn(57, 43, |x, y| image::Luma([((x * 9) ^ (y * 5)) as u8]));
    gray.save(images.join("5.jpg")).unwrap();
    write_mask(&masks.join("5.png"), 57, 43);
    let seg = || {
        TargetLoader::new(TargetSource::segmentation(&images, &masks).unwrap())
            .recipe(TargetRecipe::SegmentationTrain)
            .seed(1)
            .batch_size(2)
    };
    let segmentation = gpufeed::targets::segmentation_output();
    assert_eq!(seg().default_output(), segmentation);
    assert_eq!(check_device_batches(&seg, segmentation), 6);
    check_device_batches(&seg, segmentation.dtype(gpufeed::DType::F16));
    // Real photos (assets/: JPEGs and PNGs of several sizes) with masks of their sizes.
    let (photos, photo_masks) = (dir.join("photos"), dir.join("photo-masks"));
    std::fs::create_dir_all(&photos).unwrap();
    std::fs::create_dir_all(&photo_masks).unwrap();
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets");
    for entry in std::fs::read_dir(assets).unwrap() {
        let path = entry.unwrap().path();
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !["jpg", "png"].contains(&ext) {
            continue;
        }
        let (w, h) = image::image_dimensions(&path).unwrap();
        std::fs::copy(&path, photos.join(path.file_name().unwrap())).unwrap();
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        write_mask(&photo_masks.join(format!("{stem}.png")), w, h);
    }
    for recipe in [
        TargetRecipe::SegmentationTrain,
        TargetRecipe::SegmentationEval,
    ] {
        let real = || {
            TargetLoader::new(TargetSource::segmentation(&photos, &photo_masks).unwrap())
                .recipe(recipe)
                .seed(5)
                .batch_size(3)
        };
        // The baseline JPEGs among the photos go to the device's decoders.
        assert!(check_device_batches(&real, segmentation) > 0);
    }
}

#[test]
fn device_batches_on_the_cpu_are_refused() {
    let dir = temp("cpu-device");
    let ann = varied_coco(&dir, 2);
    let mut loader = TargetLoader::new(TargetSource::coco(&ann, &dir).unwrap());
    let e = loader.next_device_batch().unwrap().unwrap_err().to_string();
    assert!(e.contains("device"), "{e}");
}

/// `tar -cf` of `members` (names relative to `from`) as `shard`.
fn tar(shard: &Path, from: &Path, members: &[String]) {
    let status = std::process::Command::new("tar")
        .arg("-cf")
        .arg(shard)
        .arg("-C")
        .arg(from)
        .args(members)
        .status()
        .expect("tar");
    assert!(status.success());
}

/// The COCO set of `varied_coco` as WebDataset shards of `per_shard` samples under
/// `dir/shards`: `{i}.jpg` and `{i}.json` (the image's annotations in COCO's per-image form).
fn coco_as_shards(dir: &Path, ann: &Path, n: u32, per_shard: u32) -> std::path::PathBuf {
    let coco: serde_json::Value = serde_json::from_slice(&std::fs::read(ann).unwrap()).unwrap();
    let shards = dir.join("shards");
    std::fs::create_dir_all(&shards).unwrap();
    for first in (0..n).step_by(per_shard as usize) {
        let mut members = Vec::new();
        for i in first..(first + per_shard).min(n) {
            let annotations: Vec<&serde_json::Value> = coco["annotations"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|a| a["image_id"] == i)
                .collect();
            let json = serde_json::json!({"annotations": annotations, "extra": "ignored"});
            std::fs::write(dir.join(format!("{i}.json")), json.to_string()).unwrap();
            members.extend([format!("{i}.jpg"), format!("{i}.json")]);
        }
        tar(&shards.join(format!("s-{first:04}.tar")), dir, &members);
    }
    shards
}

/// Every batch of an epoch of `loader`, the ids left out (they name the files).
fn epoch_batches(mut loader: TargetLoader) -> Vec<gpufeed::targets::TargetBatch> {
    let mut out = Vec::new();
    while let Some(mut b) = loader.next_batch() {
        assert!(b.skipped.is_empty(), "{:?}", b.skipped);
        b.ids.clear();
        out.push(b);
    }
    out
}

fn same_batches(a: &[gpufeed::targets::TargetBatch], b: &[gpufeed::targets::TargetBatch]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!((x.height, x.width, &x.sizes), (y.height, y.width, &y.sizes));
        assert_eq!(x.indices, y.indices);
        assert!(x.images == y.images, "images differ");
        assert_eq!(
            (&x.boxes, &x.labels, &x.crowd),
            (&y.boxes, &y.labels, &y.crowd)
        );
        assert_eq!((&x.offsets, &x.ops), (&y.offsets, &y.ops));
        assert!(
            x.masks == y.masks && x.semantic == y.semantic,
            "masks differ"
        );
    }
}

#[test]
fn webdataset_shards_give_the_batches_of_the_folder() {
    use gpufeed::targets::TargetKind;
    let dir = temp("wds");
    let ann = varied_coco(&dir, 10);
    let shards = coco_as_shards(&dir, &ann, 10, 4);
    for (recipe, shard) in [
        (TargetRecipe::Multiscale, (0, 1)),
        (TargetRecipe::Ssd, (1, 2)),
    ] {
        let make = |source| {
            TargetLoader::new(source)
                .recipe(recipe)
                .seed(5)
                .shuffle(true)
                .batch_size(3)
                .shard(shard.0, shard.1)
                .epoch(1)
        };
        let folder = epoch_batches(make(TargetSource::coco(&ann, &dir).unwrap()));
        let wds = TargetSource::webdataset(&shards, TargetKind::Instances).unwrap();
        assert_eq!(wds.len(), 10);
        assert!(wds.has_instance_masks() && wds.is_detection());
        let first = make(wds);
        same_batches(&epoch_batches(first), &folder);
        // Resumed after the first batch: the rest, the same.
        let wds = TargetSource::webdataset(&shards, TargetKind::Instances).unwrap();
        let resumed = make(wds).resume_at(1, 3);
        same_batches(&epoch_batches(resumed), &folder[1..]);
    }
    // Without masks: the same boxes, no masks.
    let wds = TargetSource::webdataset(&shards, TargetKind::Detection).unwrap();
    let batches = epoch_batches(TargetLoader::new(wds).batch_size(10));
    let folder =
        epoch_batches(TargetLoader::new(TargetSource::coco(&ann, &dir).unwrap()).batch_size(10));
    assert_eq!(batches[0].boxes, folder[0].boxes);
    assert!(batches[0].masks.is_empty() && !folder[0].masks.is_empty());
}

#[test]
fn webdataset_segmentation_gives_the_batches_of_the_folder_pairs() {
    use gpufeed::targets::TargetKind;
    let dir = temp("wds-seg");
    let (images, masks) = (dir.join("images"), dir.join("masks"));
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(&masks).unwrap();
    let mut members = Vec::new();
    for i in 0..5u32 {
        let (w, h) = (30 + 17 * i, 50 - 5 * i);
        write_jpeg(&images.join(format!("{i}.jpg")), w, h);
        write_mask(&masks.join(format!("{i}.png")), w, h);
        std::fs::copy(
            images.join(format!("{i}.jpg")),
            dir.join(format!("{i}.jpg")),
        )
        .unwrap();
        let mask = if i % 2 == 0 { "seg.png" } else { "mask.png" };
        std::fs::copy(
            masks.join(format!("{i}.png")),
            dir.join(format!("{i}.{mask}")),
        )
        .unwrap();
        members.extend([format!("{i}.jpg"), format!("{i}.{mask}")]);
    }
    let shard = dir.join("seg.tar");
    tar(&shard, &dir, &members);
    let make = |source| {
        TargetLoader::new(source)
            .recipe(TargetRecipe::SegmentationTrain)
            .seed(2)
            .shuffle(true)
            .batch_size(2)
    };
    let folder = epoch_batches(make(TargetSource::segmentation(&images, &masks).unwrap()));
    let wds = TargetSource::webdataset(&shard, TargetKind::Semantic).unwrap();
    assert!(!wds.is_detection());
    let loader = make(wds);
    assert_eq!(
        loader.default_output().mean,
        gpufeed::targets::segmentation_output().mean
    );
    same_batches(&epoch_batches(loader), &folder);
}

#[test]
fn bad_webdataset_samples_are_skipped_with_their_reason() {
    use gpufeed::targets::TargetKind;
    let dir = temp("wds-bad");
    for name in ["a", "b", "c", "e", "f"] {
        write_jpeg(&dir.join(format!("{name}.jpg")), 40, 30);
    }
    let good = r#"{"boxes": [[2, 2, 10, 10]], "labels": [4]}"#;
    std::fs::write(dir.join("a.json"), good).unwrap();
    std::fs::write(
        dir.join("b.json"),
        r#"{"boxes": [[2, 2, 10, 10]], "labels": [4"#,
    )
    .unwrap();
    // c: no .json; d: a .json without an image.
    std::fs::write(dir.join("d.json"), good).unwrap();
    std::fs::write(
        dir.join("e.json"),
        r#"{"annotations": [{"bbox": [1, 1, 5, 5], "category_id": 1,
        "segmentation": {"size": [20, 40], "counts": [5, 10, 785]}}]}"#,
    )
    .unwrap();
    write_mask(&dir.join("f.seg.png"), 40, 20);
    let members: Vec<String> = [
        "a.jpg",
        "a.json",
        "b.jpg",
        "b.json",
        "c.jpg",
        "d.json",
        "e.jpg",
        "e.json",
        "f.jpg",
        "f.seg.png",
    ]
    .map(String::from)
    .to_vec();
    let shard = dir.join("bad.tar");
    tar(&shard, &dir, &members);
    let source = TargetSource::webdataset(&shard, TargetKind::Instances).unwrap();
    assert_eq!(source.len(), 6);
    let mut loader = TargetLoader::new(source).batch_size(8);
    let batch = loader.next_batch().unwrap();
    assert_eq!(batch.len(), 1);
    assert_eq!(batch.ids, [format!("{}:a.jpg", shard.display())]);
    assert_eq!(
        (batch.labels.as_slice(), batch.masks.len()),
        (&[4i64][..], 32 * 64)
    );
    let reasons: Vec<String> = loader
        .report()
        .skipped
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(reasons.len(), 5, "{reasons:#?}");
    let has = |key: &str, says: &str| {
        let id = format!("{}:{key}", shard.display());
        assert!(
            reasons
                .iter()
                .any(|r| r.starts_with(&id) && r.contains(says)),
            "{key}: {says}: {reasons:#?}"
        );
    };
    has("b.jpg", "the .json member is not JSON");
    has("c.jpg", "the sample has no .json member");
    has("d", "sample without an image member");
    has("e.jpg", "mask of 40x20, the image is 40x30");
    has("f.jpg", "no .json member");
    // The semantic masks of the same shard: f's is 40x20, its image 40x30.
    let source = TargetSource::webdataset(&shard, TargetKind::Semantic).unwrap();
    let mut loader = TargetLoader::new(source).batch_size(8);
    let batch = loader.next_batch().unwrap();
    assert!(batch.is_empty());
    let reasons: Vec<String> = loader
        .report()
        .skipped
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert!(reasons
        .iter()
        .any(|r| r.contains("f.jpg") && r.contains(".seg.png member is 40x20, its image 40x30")));
    assert!(reasons
        .iter()
        .any(|r| r.contains("a.jpg") && r.contains("no .seg.png or .mask.png member")));
}

#[cfg(feature = "object-store")]
#[test]
fn webdataset_shards_in_object_storage_give_the_batches_of_the_disk() {
    use gpufeed::targets::TargetKind;
    let test = "webdataset_shards_in_object_storage_give_the_batches_of_the_disk";
    let Some(server) = s3_server::S3Server::for_test(test) else {
        return;
    };
    let dir = temp("wds-s3");
    let ann = varied_coco(&dir, 9);
    let shards = coco_as_shards(&dir, &ann, 9, 4);
    let mut objects = Vec::new();
    for entry in std::fs::read_dir(&shards).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        objects.push((format!("targets/{name}"), std::fs::read(&path).unwrap()));
    }
    server.put_all(objects).expect("upload");
    let mut options = gpufeed::RemoteOptions::default();
    for (key, value) in server.store_options() {
        options = options.store_option(key, value);
    }
    let make = |source| {
        TargetLoader::new(source)
            .recipe(TargetRecipe::Hflip)
            .seed(9)
            .shuffle(true)
            .batch_size(4)
    };
    let disk = epoch_batches(make(
        TargetSource::webdataset(&shards, TargetKind::Instances).unwrap(),
    ));
    let remote =
        TargetSource::url(&server.url("targets/"), TargetKind::Instances, &options).expect("s3");
    assert_eq!(
        remote.id(0).unwrap(),
        server.url("targets/s-0000.tar:0.jpg")
    );
    same_batches(&epoch_batches(make(remote)), &disk);
}

/// What a batch hands out, all of it: the text of its rows' targets, calls, sizes and skipped
/// samples, and its images', instance masks' and semantic masks' bytes.
type Seen = (String, Vec<u8>, Vec<u8>, Vec<u8>);

fn seen(b: &gpufeed::targets::TargetBatch) -> Seen {
    let skipped: Vec<(usize, &str, String)> = b
        .skipped
        .iter()
        .map(|e| (e.index, e.id.as_str(), e.kind.to_string()))
        .collect();
    let text = format!(
        "epoch {} rows {:?} ids {:?} {}x{} sizes {:?} boxes {:?} labels {:?} crowd {:?} \
         keypoints {:?} offsets {:?} ops {:?} inverse {:?} skipped {skipped:?}",
        b.epoch,
        b.indices,
        b.ids,
        b.height,
        b.width,
        b.sizes,
        b.boxes,
        b.labels,
        b.crowd,
        b.keypoints,
        b.offsets,
        b.ops,
        b.inverse
    );
    (text, b.images.clone(), b.masks.clone(), b.semantic.clone())
}

/// The loader's report as text.
fn report_text(loader: &TargetLoader) -> String {
    let r = loader.report();
    let skipped: Vec<(usize, String)> = r
        .skipped
        .iter()
        .map(|e| (e.index, e.kind.to_string()))
        .collect();
    format!(
        "{} samples, {} objects, {} dropped, skipped {skipped:?}",
        r.samples, r.objects, r.dropped_objects
    )
}

/// Every batch of `loader`'s epochs up to `until` (exclusive), each batch's buffers spoiled and
/// handed back before the next is asked for, and the report at the end; on a pool of `threads`.
fn batches_until(
    make: &(dyn Fn() -> TargetLoader + Sync),
    threads: usize,
    until: u64,
) -> (Vec<Seen>, String) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let mut loader = make();
        let mut out = Vec::new();
        while loader.current_epoch() < until {
            while let Some(mut b) = loader.next_batch() {
                out.push(seen(&b));
                b.images.fill(0xAB);
                b.masks.fill(0xAB);
                b.semantic.fill(0xAB);
                loader.recycle(b);
            }
            loader.next_epoch();
        }
        (out, report_text(&loader))
    })
}

#[test]
fn batches_made_ahead_equal_those_made_when_asked() {
    // COCO with instance masks (lsj) and a missing image; segmentation pairs (train) with a
    // mask of another size. Batches of 4 over 13 samples: a short last batch each epoch.
    let coco_dir = temp("ahead-coco");
    let ann = varied_coco(&coco_dir, 13);
    std::fs::remove_file(coco_dir.join("6.jpg")).unwrap();
    let seg = temp("ahead-seg");
    let (images, masks) = (seg.join("images"), seg.join("masks"));
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(&masks).unwrap();
    for i in 0..13u32 {
        let (w, h) = (31 + 29 * (i % 6), 70 - 9 * (i % 5));
        write_jpeg(&images.join(format!("{i:02}.jpg")), w, h);
        let mh = if i == 4 { h + 1 } else { h };
        write_mask(&masks.join(format!("{i:02}.png")), w, mh);
    }
    let coco = |prefetch: usize| {
        TargetLoader::new(TargetSource::coco(&ann, &coco_dir).unwrap())
            .recipe(TargetRecipe::Lsj)
            .seed(3)
            .shuffle(true)
            .batch_size(4)
            .prefetch(prefetch)
    };
    let pairs = |prefetch: usize| {
        TargetLoader::new(TargetSource::segmentation(&images, &masks).unwrap())
            .recipe(TargetRecipe::SegmentationTrain)
            .seed(8)
            .shuffle(true)
            .batch_size(4)
            .prefetch(prefetch)
    };
    let loaders: [&(dyn Fn(usize) -> TargetLoader + Sync); 2] = [&coco, &pairs];
    for make in loaders {
        // Made when asked, on one thread: the reference.
        let (want, report) = batches_until(&|| make(0), 1, 3);
        assert_eq!(want.len(), 12, "4 batches an epoch, 3 epochs");
        assert_eq!(
            want.iter().filter(|b| b.0.contains("skipped []")).count(),
            9,
            "one sample skipped each epoch: {report}"
        );
        for (threads, prefetch) in [(1, 3), (3, 0), (3, 1), (3, 3), (2, 64)] {
            let (got, got_report) = batches_until(&|| make(prefetch), threads, 3);
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.0, w.0, "batch {i}, {threads} threads, {prefetch} ahead");
                assert!(
                    g.1 == w.1 && g.2 == w.2 && g.3 == w.3,
                    "batch {i}'s pixels or masks differ, {threads} threads, {prefetch} ahead"
                );
            }
            assert_eq!(got_report, report);
        }
        // Resumed in the middle of epoch 1: the same batches follow, into epoch 2.
        for prefetch in [0, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .unwrap();
            let got = pool.install(|| {
                let mut loader = make(prefetch).resume_at(1, 4);
                let mut out = Vec::new();
                for _ in 0..2 {
                    while let Some(b) = loader.next_batch() {
                        out.push(seen(&b));
                    }
                    loader.next_epoch();
                }
                out
            });
            assert!(got == want[5..], "resumed at (1, 4), {prefetch} ahead");
        }
    }
}

#[test]
fn options_changed_mid_epoch_drop_the_batches_made_ahead() {
    let dir = temp("ahead-change");
    let ann = varied_coco(&dir, 20);
    let make = || {
        TargetLoader::new(TargetSource::coco(&ann, &dir).unwrap())
            .recipe(TargetRecipe::Lsj)
            .seed(3)
            .shuffle(true)
            .batch_size(3)
    };
    let first = |loader: TargetLoader| seen(&loader.prefetch(0).next_batch().unwrap());
    let mut loader = make().prefetch(4);
    loader.next_batch().unwrap();
    // The same position (3), another padding value.
    loader = loader.pad_fill(9);
    assert!(seen(&loader.next_batch().unwrap()) == first(make().pad_fill(9).resume_at(0, 3)));
    // Another seed starts the epoch over.
    loader = loader.seed(4);
    assert_eq!(loader.position(), (0, 0));
    assert!(seen(&loader.next_batch().unwrap()) == first(make().pad_fill(9).seed(4)));
    // Another recipe, another batch size, then back to the position after the first batch.
    loader = loader
        .recipe(TargetRecipe::Hflip)
        .batch_size(5)
        .resume_at(0, 3);
    let again = || {
        make()
            .pad_fill(9)
            .seed(4)
            .recipe(TargetRecipe::Hflip)
            .batch_size(5)
    };
    assert!(seen(&loader.next_batch().unwrap()) == first(again().resume_at(0, 3)));
    // Another epoch in the middle of this one.
    loader.next_epoch();
    assert_eq!(loader.position(), (1, 0));
    assert!(seen(&loader.next_batch().unwrap()) == first(again().epoch(1)));
}

#[test]
fn dropping_a_loader_mid_epoch_returns() {
    use rayon::prelude::*;
    let dir = temp("ahead-drop");
    let ann = varied_coco(&dir, 40);
    let make = move || {
        TargetLoader::new(TargetSource::coco(&ann, &dir).unwrap())
            .recipe(TargetRecipe::Lsj)
            .batch_size(4)
            .prefetch(6)
    };
    // On pools of one and two threads, the loader used and dropped inside the pool, then the
    // pool used again; and from a thread outside the pool, dropped at once and after a batch.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut loader = make();
                loader.next_batch().unwrap();
                drop(loader);
            });
            let sum: u64 = pool.install(|| (0..100u64).into_par_iter().sum());
            tx.send(format!("{threads} threads: {sum}")).unwrap();
        }
        for take in [0, 1] {
            let mut loader = make();
            for _ in 0..take {
                loader.next_batch().unwrap();
            }
            drop(loader);
            tx.send(format!("dropped after {take}")).unwrap();
        }
    });
    let wait = std::time::Duration::from_secs(120);
    for want in [
        "1 threads: 4950",
        "2 threads: 4950",
        "dropped after 0",
        "dropped after 1",
    ] {
        assert_eq!(rx.recv_timeout(wait).as_deref(), Ok(want));
    }
}
