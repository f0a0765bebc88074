//! `gpufeed targets DIR`: detection or segmentation samples with their targets (a COCO file, mask
//! folders, or WebDataset shards on disk or in object storage), transformed by
//! one of torchvision's reference recipes and batched; `--save OUT` writes each batch's images
//! and masks as `.npy` and every row's targets and calls to `OUT/targets.jsonl`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpufeed::targets::{
    BoxFormat, TargetBatch, TargetKind, TargetLoader, TargetRecipe, TargetSource,
};
use serde_json::{json, Value};

use crate::Result;

#[derive(clap::Args, Debug)]
pub struct TargetArgs {
    /// The image folder; with --webdataset, a folder of .tar shards, one shard, or a URL
    /// (s3://bucket/prefix/, a shard's URL, or s3://b/train-{000..009}.tar).
    dir: PathBuf,
    /// A COCO instances file (`instances_*.json`) naming the images under DIR.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present_any = ["masks", "webdataset"],
        conflicts_with_all = ["masks", "webdataset"]
    )]
    coco: Option<PathBuf>,
    /// DIR holds WebDataset shards, each sample's targets beside its image: `detection`
    /// (KEY.json boxes and labels), `instances` (KEY.json with a mask per object) or `semantic`
    /// (KEY.seg.png or KEY.mask.png).
    #[arg(long, value_name = "KIND", value_parser = ["detection", "instances", "semantic"], conflicts_with = "masks")]
    webdataset: Option<String>,
    /// A folder of PNG masks, one per image of DIR of the same relative path and stem
    /// (semantic segmentation).
    #[arg(long, value_name = "DIR")]
    masks: Option<PathBuf>,
    /// Detection recipe: none, hflip, lsj, multiscale, ssd, ssdlite, or letterbox:W:H (inference).
    #[arg(long, default_value = "none", value_parser = parse_recipe, conflicts_with = "segmentation_recipe")]
    detection_recipe: TargetRecipe,
    /// Segmentation recipe: train (RandomResize(260, 1040), flip, RandomCrop(480)) or eval
    /// (Resize(520)).
    #[arg(long, value_parser = ["train", "eval"])]
    segmentation_recipe: Option<String>,
    /// Rows a batch.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Seed of the draws (and the shuffle).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Shuffle each epoch.
    #[arg(long)]
    shuffle: bool,
    /// Epochs.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Pad each batch's images to a multiple of N.
    #[arg(long, default_value_t = 32)]
    size_divisible: u32,
    /// Batches made ahead while one is used (0: each made when asked for) [default: six rows
    /// for each thread, at least 3 batches].
    #[arg(long, value_name = "N")]
    prefetch: Option<usize>,
    /// This process's part: RANK/WORLD.
    #[arg(long, value_parser = parse_shard)]
    shard: Option<(usize, usize)>,
    /// Write the batches here: batch-E-B.images.npy (N, H, W, 3 u8), .masks.npy or
    /// .semantic.npy, and targets.jsonl (a line a row).
    #[arg(long, value_name = "DIR")]
    save: Option<PathBuf>,
    /// The saved boxes' format: xyxy, xywh or cxcywh.
    #[arg(long, default_value = "xyxy", value_parser = ["xyxy", "xywh", "cxcywh"])]
    box_format: String,
    /// Put each batch on CUDA device N: the rows resized, padded and normalized there (the
    /// recipe's default dtype, mean and std), the masks uploaded; timed until the last batch is
    /// on the device. Without it the batches stay in host memory.
    #[arg(long, value_name = "N", conflicts_with = "save")]
    device: Option<usize>,
    /// With --device, who decodes the JPEGs: auto (the device's cores once their decoders are
    /// open, a few tenths of a second in; the CPU threads before), hybrid (the same, the first
    /// batch waiting for the decoders) or cpu (the CPU threads, every image). The same bytes
    /// either way.
    #[arg(long, default_value_t = gpufeed::Decode::Auto)]
    decode: gpufeed::Decode,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_recipe(text: &str) -> std::result::Result<TargetRecipe, String> {
    match TargetRecipe::parse(text) {
        Some(TargetRecipe::SegmentationTrain | TargetRecipe::SegmentationEval) | None => {
            Err("one of none, hflip, lsj, multiscale, ssd, ssdlite, letterbox:W:H".to_string())
        }
        Some(r) => Ok(r),
    }
}

fn parse_shard(text: &str) -> std::result::Result<(usize, usize), String> {
    let (r, w) = text.split_once('/').ok_or("RANK/WORLD")?;
    let (r, w): (usize, usize) = (
        r.parse().map_err(|_| "RANK/WORLD")?,
        w.parse().map_err(|_| "RANK/WORLD")?,
    );
    if w == 0 || r >= w {
        return Err("RANK/WORLD with RANK below WORLD".into());
    }
    Ok((r, w))
}

/// Runs the command.
pub fn run(args: &TargetArgs) -> Result<()> {
    let start = Instant::now();
    let segmentation = match args.segmentation_recipe.as_deref() {
        Some("train") => TargetRecipe::SegmentationTrain,
        _ => TargetRecipe::SegmentationEval,
    };
    let (source, recipe) = match (&args.coco, &args.masks, args.webdataset.as_deref()) {
        (Some(coco), _, _) => (TargetSource::coco(coco, &args.dir)?, args.detection_recipe),
        (None, Some(masks), _) => (TargetSource::segmentation(&args.dir, masks)?, segmentation),
        (None, None, Some(kind)) => {
            let kind = match kind {
                "semantic" => TargetKind::Semantic,
                "instances" => TargetKind::Instances,
                _ => TargetKind::Detection,
            };
            let text = args.dir.to_string_lossy();
            let source = if text.contains("://") {
                TargetSource::url(&text, kind, &gpufeed::RemoteOptions::default())?
            } else {
                TargetSource::webdataset(&args.dir, kind)?
            };
            let recipe = match kind {
                TargetKind::Semantic => segmentation,
                _ => args.detection_recipe,
            };
            (source, recipe)
        }
        (None, None, None) => {
            return Err("give --coco FILE, --masks DIR or --webdataset KIND".into())
        }
    };
    let coco_report = source.coco_file().map(|c| c.report);
    let instance = source.has_instance_masks();
    let (rank, world) = args.shard.unwrap_or((0, 1));
    let mut loader = TargetLoader::new(source)
        .recipe(recipe)
        .seed(args.seed)
        .shuffle(args.shuffle)
        .batch_size(args.batch_size)
        .size_divisible(args.size_divisible)
        .shard(rank, world);
    if let Some(n) = args.prefetch {
        loader = loader.prefetch(n);
    }
    let mut lines = match &args.save {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let path = dir.join("targets.jsonl");
            let file = std::fs::File::create(&path)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Some(std::io::BufWriter::new(file))
        }
        None => None,
    };
    let (mut batches, mut rows, mut objects) = (0usize, 0usize, 0usize);
    // From the command's start to the first batch handed out, and the rows of that batch.
    let mut first: Option<(f64, usize)> = None;
    if let Some(ordinal) = args.device {
        loader = loader
            .device(gpufeed::Device::Cuda(ordinal))
            .decode_lanes(args.decode);
        let mut last = None;
        for epoch in 0..args.epochs {
            while let Some(batch) = loader.next_device_batch() {
                let batch = batch?;
                first.get_or_insert((start.elapsed().as_secs_f64(), batch.targets.len()));
                rows += batch.targets.len();
                objects += batch.targets.boxes.len();
                batches += 1;
                last = Some(batch.images);
            }
            if epoch + 1 < args.epochs {
                loader.next_epoch();
            }
        }
        // The loader's work is one stream: the last batch there means all are.
        if let Some(images) = last {
            images.synchronize()?;
        }
    }
    let host_epochs = match args.device {
        Some(_) => 0,
        None => args.epochs,
    };
    for epoch in 0..host_epochs {
        let mut b = 0usize;
        while let Some(batch) = loader.next_batch() {
            first.get_or_insert((start.elapsed().as_secs_f64(), batch.len()));
            if let (Some(dir), Some(lines)) = (&args.save, lines.as_mut()) {
                let format = match args.box_format.as_str() {
                    "xywh" => BoxFormat::Xywh,
                    "cxcywh" => BoxFormat::Cxcywh,
                    _ => BoxFormat::Xyxy,
                };
                save_batch(dir, lines, &batch, b, instance, format)?;
            }
            rows += batch.len();
            objects += batch.boxes.len();
            batches += 1;
            b += 1;
            loader.recycle(batch);
        }
        if epoch + 1 < args.epochs {
            loader.next_epoch();
        }
    }
    if let Some(mut lines) = lines {
        lines.flush()?;
    }
    let report = loader.report();
    let seconds = start.elapsed().as_secs_f64();
    let errors: Vec<Value> = report
        .skipped
        .iter()
        .map(|e| json!({"path": e.id, "index": e.index, "reason": e.kind.to_string()}))
        .collect();
    let summary = json!({
        "recipe": format!("{recipe:?}"),
        "batches": batches,
        "images": rows,
        "objects": objects,
        "objects_loaded": report.objects,
        "objects_dropped": report.dropped_objects,
        "decoded_on_device": report.decoded_on_device,
        "decode": loader.decode_description().unwrap_or_else(|| "the CPU threads".into()),
        "skipped": errors.len(),
        "errors": errors,
        "orphan_annotations": coco_report.map(|r| r.orphan_annotations),
        "unknown_categories": coco_report.map(|r| r.unknown_categories),
        "seconds": seconds,
        "images_per_s": rows as f64 / seconds.max(1e-9),
        "first_batch_seconds": first.map(|f| f.0),
        // After the first batch: the rate once the decoding (and the device) has started.
        "steady_images_per_s": first.map(|(at, n)| (rows - n) as f64 / (seconds - at).max(1e-9)),
    });
    if args.json {
        out!("{summary}");
    } else {
        out!(
            "{rows} images in {batches} batches ({objects} objects kept, {} dropped by \
             SanitizeBoundingBoxes), {} skipped, {:.1} images/s",
            report.dropped_objects,
            report.skipped.len(),
            rows as f64 / seconds.max(1e-9)
        );
        for e in &report.skipped {
            out!("skipped {}: {}", e.id, e.kind);
        }
    }
    Ok(())
}

/// Writes batch `b`'s arrays and its rows' lines.
fn save_batch(
    dir: &Path,
    lines: &mut impl Write,
    batch: &TargetBatch,
    b: usize,
    instance: bool,
    format: BoxFormat,
) -> Result<()> {
    let stem = format!("batch-{}-{b:05}", batch.epoch);
    let (h, w) = (batch.height as usize, batch.width as usize);
    write_npy(
        &dir.join(format!("{stem}.images.npy")),
        &[batch.len(), h, w, 3],
        &batch.images,
    )?;
    if instance {
        let planes = batch.masks.len() / (h * w).max(1);
        write_npy(
            &dir.join(format!("{stem}.masks.npy")),
            &[planes, h, w],
            &batch.masks,
        )?;
    }
    if !batch.semantic.is_empty() {
        write_npy(
            &dir.join(format!("{stem}.semantic.npy")),
            &[batch.len(), h, w],
            &batch.semantic,
        )?;
    }
    for row in 0..batch.len() {
        let ops: Vec<Value> = batch.ops[row].iter().map(|op| op.json()).collect();
        let (o0, o1) = (batch.offsets[row], batch.offsets[row + 1]);
        let m = &batch.inverse[row];
        let line = json!({
            "file": format!("{stem}.images.npy"),
            "epoch": batch.epoch,
            "row": row,
            "index": batch.indices[row],
            "id": batch.ids[row],
            "original": [m.height, m.width],
            "size": [batch.sizes[row].0, batch.sizes[row].1],
            "boxes": batch.row_boxes_as(row, format),
            "labels": batch.labels[o0..o1],
            "crowd": batch.crowd[o0..o1],
            "keypoints": batch.keypoints.get(o0..o1).unwrap_or(&[]),
            "objects": [o0, o1],
            "ops": ops,
        });
        writeln!(lines, "{line}")?;
    }
    Ok(())
}

/// A `u8` `.npy` of `shape`.
fn write_npy(path: &Path, shape: &[usize], data: &[u8]) -> Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': {tuple}, }}");
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + data.len());
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()).into())
}
