//! What a hostile folder or option must not do: hang the pipeline, abort the process, grow
//! memory without bound, or change the output without a word. Runs everywhere (CPU device).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{repo_path, TempDir};
use gpufeed::{Device, Error, ItemErrorKind, Pipeline, ResizeMode, Source};

/// Every batch of one epoch on the CPU: (good ids, skipped as "id: reason").
fn run(source: Source) -> (Vec<String>, Vec<String>) {
    let mut pipeline = Pipeline::builder()
        .source(source)
        .batch_size(3)
        .resize(ResizeMode::stretch(16, 16))
        .device(Device::Cpu)
        .build()
        .expect("build");
    let mut good = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("skip policy") {
        good.extend(batch.ids().iter().cloned());
    }
    let skipped = pipeline
        .epoch_report()
        .skipped
        .iter()
        .map(|e| e.to_string())
        .collect();
    (good, skipped)
}

fn reason_for<'a>(skipped: &'a [String], name: &str) -> &'a str {
    skipped
        .iter()
        .find(|s| s.contains(name))
        .map_or("", String::as_str)
}

/// A FIFO named like an image, links to endless devices, sparse files of gigabytes and an
/// unreadable subfolder: the folder completes in seconds, every good image decoded and every
/// special file reported; dropping a pipeline over it mid-epoch returns at once.
#[test]
fn special_files_are_reported_without_hanging() {
    let dir = TempDir::new("special");
    std::fs::copy(repo_path("assets/rocket.jpg"), dir.join("a_good.jpg")).expect("copy");
    let fifo = dir.join("b_fifo.jpg");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    let have_fifo = made.is_ok_and(|s| s.success());
    std::os::unix::fs::symlink("/dev/zero", dir.join("c_zero.jpg")).expect("symlink");
    std::os::unix::fs::symlink("/dev/urandom", dir.join("d_urandom.png")).expect("symlink");
    let sparse = std::fs::File::create(dir.join("e_sparse_6gb.jpg")).expect("create");
    sparse.set_len(6 << 30).expect("sparse file");
    let sparse = std::fs::File::create(dir.join("f_sparse_300mb.jpg")).expect("create");
    sparse.set_len(300 << 20).expect("sparse file");
    let locked = dir.join("g_locked");
    std::fs::create_dir(&locked).expect("dir");
    std::fs::copy(repo_path("assets/chelsea.png"), locked.join("inside.png")).expect("copy");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).expect("chmod");
    // Root reads any folder: then the folder's image is simply decoded.
    let locked_readable = std::fs::read_dir(&locked).is_ok();

    let start = Instant::now();
    let source = Source::directory(dir.path()).expect("listing skips what it cannot read");
    assert_eq!(
        source.unreadable_folders().len(),
        usize::from(!locked_readable),
        "{:?}",
        source.unreadable_folders()
    );
    let (good, skipped) = run(source);
    let elapsed = start.elapsed();
    let _ = std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755));
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}");
    assert!(good[0].ends_with("a_good.jpg"), "{good:?}");
    assert_eq!(good.len(), 1 + usize::from(locked_readable), "{good:?}");
    if have_fifo {
        assert!(
            reason_for(&skipped, "b_fifo.jpg").contains("FIFO"),
            "{skipped:?}"
        );
    }
    assert!(
        reason_for(&skipped, "c_zero.jpg").contains("character device"),
        "{skipped:?}"
    );
    assert!(
        reason_for(&skipped, "d_urandom.png").contains("character device"),
        "{skipped:?}"
    );
    assert!(
        reason_for(&skipped, "e_sparse_6gb.jpg").contains("over the limit"),
        "{skipped:?}"
    );
    assert!(
        reason_for(&skipped, "f_sparse_300mb.jpg").contains("not a JPEG"),
        "{skipped:?}"
    );
    assert_eq!(skipped.len(), 4 + usize::from(have_fifo), "{skipped:?}");

    // A pipeline dropped while its worker may be at the special files returns promptly.
    if have_fifo {
        let start = Instant::now();
        let pipeline = Pipeline::builder()
            .source(Source::paths(vec![fifo.clone(); 64]))
            .batch_size(8)
            .device(Device::Cpu)
            .build()
            .expect("build");
        std::thread::sleep(Duration::from_millis(50));
        drop(pipeline);
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}

/// Options too large for any machine are refused by `build()` in milliseconds with an error
/// naming the option, never an abort from a failed allocation.
#[test]
fn oversized_options_are_errors_naming_the_option() {
    // Many positions: a batch is never larger than an epoch.
    let source = || Source::paths(vec![repo_path("assets/rocket.jpg"); 300_000]);
    type Case = (&'static str, Box<dyn Fn() -> gpufeed::PipelineBuilder>);
    let cases: [Case; 7] = [
        (
            "batch_size",
            Box::new(|| Pipeline::builder().batch_size(300_000)),
        ),
        // One image of 1 x 1,000,000,000 (9 GB staged and converted): too few fit on any
        // machine, so the size is named, not the batch. (One of 1 x 100,000,000 names the batch
        // size where 16 of them fit, as on a machine of 128 GB.)
        (
            "resize",
            Box::new(|| Pipeline::builder().resize(ResizeMode::stretch(1, 1_000_000_000))),
        ),
        // Soft labels of 4,000,000,000 classes: 128 GB for a batch of 8.
        (
            "num_classes",
            Box::new(|| {
                Pipeline::builder()
                    .batch_size(8)
                    .mixup(0.8)
                    .num_classes(4_000_000_000)
            }),
        ),
        (
            "resize",
            Box::new(|| Pipeline::builder().resize(ResizeMode::center_crop(256, 100_000))),
        ),
        (
            "prefetch",
            Box::new(|| Pipeline::builder().prefetch(10_000_000_000)),
        ),
        ("threads", Box::new(|| Pipeline::builder().threads(20_000))),
        (
            "batch_size",
            Box::new(|| {
                Pipeline::builder()
                    .batch_size(usize::MAX / 2)
                    .resize(ResizeMode::stretch(900, 900))
            }),
        ),
    ];
    let labelled = || {
        Source::paths(vec![repo_path("assets/rocket.jpg"); 64])
            .with_labels(vec![1; 64])
            .expect("labels")
    };
    for (k, (option, builder)) in cases.into_iter().enumerate() {
        let start = Instant::now();
        let source = if option == "num_classes" {
            labelled()
        } else {
            source()
        };
        let result = builder().source(source).device(Device::Cpu).build();
        match result {
            Err(Error::InvalidOption {
                option: named,
                reason,
            }) => {
                assert_eq!(named, option, "case {k}: {reason}");
                assert!(!reason.contains("DrawRange"), "{reason}");
            }
            other => panic!("{option}: expected an invalid option, got {other:?}"),
        }
        assert!(start.elapsed() < Duration::from_secs(3), "{option}");
    }
    // A batch larger than the epoch is cut to it: 10,000 over one image holds one image's
    // buffers, not 10,000's.
    let pipeline = Pipeline::builder()
        .source(Source::paths([repo_path("assets/rocket.jpg")]))
        .batch_size(10_000)
        .device(Device::Cpu)
        .build()
        .expect("a batch of one");
    assert_eq!(pipeline.options().batching.batch_size, 1);
    assert_eq!(pipeline.batches_per_epoch(), 1);
    // RandomErasing's chance out of range says so in words.
    let erasing = Pipeline::builder()
        .source(source())
        .augment_options(
            gpufeed::AugmentOptions::default()
                .random_erasing(Some(gpufeed::RandomErasing::new(2.0))),
        )
        .device(Device::Cpu)
        .build()
        .expect_err("p 2");
    assert!(
        erasing
            .to_string()
            .contains("2 is not a chance from 0 to 1"),
        "{erasing}"
    );
}

/// A JPEG cut short is refused as truncated, as Pillow refuses it ("image file is truncated"),
/// not delivered with its lower part filled in; a PNG cut short likewise.
#[test]
fn truncated_images_are_refused() {
    let jpeg = std::fs::read(repo_path("assets/rocket.jpg")).expect("jpeg");
    let png = std::fs::read(repo_path("assets/chelsea.png")).expect("png");
    let source = Source::bytes([
        ("jpeg-60%", jpeg[..jpeg.len() * 6 / 10].to_vec()),
        ("whole", jpeg.clone()),
        ("png-70%", png[..png.len() * 7 / 10].to_vec()),
    ]);
    let mut pipeline = Pipeline::builder()
        .source(source)
        .batch_size(3)
        .device(Device::Cpu)
        .build()
        .expect("build");
    let batch = pipeline.next_batch().expect("batch").expect("one batch");
    assert_eq!(batch.ids(), ["whole"]);
    let kinds: Vec<_> = batch.skipped().iter().map(|e| (&e.id, &e.kind)).collect();
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    for (id, kind) in kinds {
        assert!(
            matches!(kind, ItemErrorKind::Truncated(_)),
            "{id}: expected truncated, got {kind:?}"
        );
    }
}

/// Writes a tiny image in `format` at `path`.
fn tiny(path: &Path) {
    let image = image::RgbImage::from_fn(8, 8, |x, y| image::Rgb([x as u8 * 30, y as u8 * 30, 9]));
    let lower = path.to_string_lossy().to_lowercase();
    if lower.ends_with(".ppm") || lower.ends_with(".pgm") {
        let gray = lower.ends_with(".pgm");
        let mut bytes = format!("{}\n8 8\n255\n", if gray { "P5" } else { "P6" }).into_bytes();
        for p in image.pixels() {
            if gray {
                bytes.push(p[0]);
            } else {
                bytes.extend_from_slice(&p.0);
            }
        }
        std::fs::write(path, bytes).expect("pnm");
        return;
    }
    let format = image::ImageFormat::from_path(path).unwrap_or(image::ImageFormat::Png);
    image.save_with_format(path, format).expect("image");
}

/// The same files, in the same order, as torchvision's `ImageFolder` lists (checked against
/// torchvision 0.29: `.gif` and `.txt` left out, `.ppm`/`.pgm` in, a file named just `.jpg` in,
/// a symbolic link to a folder a class of its own), and a class without images refused as
/// torchvision refuses it.
#[test]
fn image_folder_lists_exactly_what_torchvision_lists() {
    let root = TempDir::new("imagefolder");
    for rel in [
        "cls_a/a.png",
        "cls_a/b.webp",
        "cls_a/c.tar.bmp",
        "cls_b/x.JPG",
        "cls_b/y.gif",
        "cls_b/.jpg",
        "cls_b/sub/p.ppm",
        "cls_b/sub/q.PGM",
        "afile.jpg",
    ] {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        tiny(&path);
    }
    std::fs::write(root.join("cls_b/z.txt"), "notes").expect("txt");
    std::os::unix::fs::symlink(root.join("cls_a"), root.join("cls_c")).expect("symlink");
    std::fs::create_dir(root.join("empty_cls")).expect("dir");
    match Source::image_folder(root.path()) {
        Err(e @ Error::Source { .. }) => {
            assert!(e.to_string().contains("empty_cls"), "{e}")
        }
        other => panic!("expected an error for the empty class, got {other:?}"),
    }
    std::fs::remove_dir(root.join("empty_cls")).expect("rmdir");
    let source = Source::image_folder(root.path()).expect("image folder");
    let listed: Vec<String> = (0..source.len())
        .map(|i| {
            Path::new(source.id(i).expect("id"))
                .strip_prefix(root.path())
                .expect("under root")
                .display()
                .to_string()
        })
        .collect();
    let expected = [
        "cls_a/a.png",
        "cls_a/b.webp",
        "cls_a/c.tar.bmp",
        "cls_b/.jpg",
        "cls_b/x.JPG",
        "cls_b/sub/p.ppm",
        "cls_b/sub/q.PGM",
        "cls_c/a.png",
        "cls_c/b.webp",
        "cls_c/c.tar.bmp",
    ];
    assert_eq!(listed, expected);
    assert_eq!(
        source.class_names().expect("classes"),
        ["cls_a", "cls_b", "cls_c"]
    );
    // Every listed file decodes, the PNM ones included.
    let (good, skipped) = run(source);
    assert_eq!(good.len(), expected.len(), "{skipped:?}");
    // A folder with no image file at all is an error too (torchvision's DatasetFolder raises).
    let empty = TempDir::new("empty");
    std::fs::write(empty.join("notes.txt"), "no images here").expect("txt");
    assert!(matches!(
        Source::directory(empty.path()),
        Err(Error::Source { .. })
    ));
}

/// Two file names that differ in one non-UTF-8 byte keep different ids; a name with a newline
/// keeps its newline in the id.
#[test]
fn ids_are_faithful_to_the_file_names() {
    use std::os::unix::ffi::OsStrExt;
    let dir = TempDir::new("names");
    let names: [&[u8]; 3] = [b"a\xff.png", b"a\xfe.png", b"line\nbreak.png"];
    for name in names {
        tiny(&dir.join(std::ffi::OsStr::from_bytes(name)));
    }
    let source = Source::directory(dir.path()).expect("list");
    let ids: Vec<&str> = (0..source.len())
        .map(|i| source.id(i).expect("id"))
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().any(|id| id.ends_with("a\\xfe.png")), "{ids:?}");
    assert!(ids.iter().any(|id| id.ends_with("a\\xff.png")), "{ids:?}");
    assert!(
        ids.iter().any(|id| id.ends_with("line\nbreak.png")),
        "{ids:?}"
    );
    let (good, _) = run(source);
    assert_eq!(good.len(), 3);
}

/// Iterating the pipeline runs the epochs asked for and no more: after two loops the pipeline
/// is at the end of epoch 1, with nothing started behind it.
#[test]
fn iterating_starts_no_epoch_nobody_asked_for() {
    let mut pipeline = Pipeline::builder()
        .source(Source::directory(repo_path("assets")).expect("assets"))
        .batch_size(3)
        .resize(ResizeMode::stretch(8, 8))
        .device(Device::Cpu)
        .build()
        .expect("build");
    let mut per_epoch = Vec::new();
    for epoch in 0..2 {
        let mut images = 0;
        for batch in &mut pipeline {
            let batch = batch.expect("batch");
            assert_eq!(batch.epoch(), epoch);
            images += batch.len();
        }
        per_epoch.push(images);
    }
    assert_eq!(per_epoch, [7, 7]);
    assert_eq!(pipeline.epoch(), 1);
    assert!(pipeline.epoch_report().complete);
    // `next_batch` at the end of an epoch stays at its end.
    assert!(pipeline.next_batch().expect("end").is_none());
    assert_eq!(pipeline.epoch(), 1);
}

/// 16-bit gray PNGs follow torchvision (clipped to 255) by default; the golden tests check the
/// pixels, this checks the choice is the default and the other one is there.
#[test]
fn sixteen_bit_gray_is_clipped_by_default() {
    let one = |gray16| {
        let mut pipeline = Pipeline::builder()
            .source(Source::paths([repo_path("tests/fixtures/gray16.png")]))
            .resize(ResizeMode::stretch(4, 4))
            .mean_std([0.0; 3], [1.0 / 255.0; 3])
            .dtype(gpufeed::DType::F32)
            .gray16(gray16)
            .device(Device::Cpu)
            .build()
            .expect("build");
        let batch = pipeline.next_batch().expect("batch").expect("one");
        batch.images().to_host().expect("host").to_f32_vec()
    };
    let clipped = one(gpufeed::Gray16::default());
    let scaled = one(gpufeed::Gray16::Scale);
    assert!(
        clipped.iter().all(|&v| v == 255.0 || v == 0.0),
        "{clipped:?}"
    );
    assert!(scaled.iter().any(|&v| v > 0.0 && v < 255.0), "{scaled:?}");
}

/// A symbolic link inside a class to the root or to another class is not followed (each image is
/// listed once, under its own class), while a class that is itself a link stays a class; plain
/// folders take GIFs and count the files they leave out by extension.
#[test]
fn links_to_folders_listed_anyway_are_not_followed_and_left_out_files_are_counted() {
    let root = TempDir::new("loops");
    for rel in ["cat/a.png", "cat/sub/b.png", "dog/c.png", "dog/d.gif"] {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        tiny(&path);
    }
    std::fs::write(root.join("dog/notes.txt"), "x").expect("txt");
    std::os::unix::fs::symlink(root.path(), root.join("cat/loop")).expect("symlink");
    std::os::unix::fs::symlink(root.join("dog"), root.join("cat/sub/dogs")).expect("symlink");
    let source = Source::image_folder(root.path()).expect("image folder");
    let listed: Vec<String> = (0..source.len())
        .map(|i| {
            Path::new(source.id(i).expect("id"))
                .strip_prefix(root.path())
                .expect("under root")
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(listed, ["cat/a.png", "cat/sub/b.png", "dog/c.png"]);
    assert_eq!(
        source.left_out(),
        [("gif".to_string(), 1), ("txt".to_string(), 1)]
    );
    let plain = Source::directory(root.path()).expect("directory");
    assert_eq!(plain.len(), 4, "the GIF is listed, each image once");
    assert_eq!(plain.left_out(), [("txt".to_string(), 1)]);
    let (good, skipped) = run(plain);
    assert_eq!(good.len(), 4, "{skipped:?}");
}

/// `batches_per_epoch` (Python's `len(pipe)`) counts out the images known to be unreadable:
/// once an epoch has skipped two corrupt files of 302, the next epoch's count is the batches
/// that come; damaged parts of a tar shard are counted out from the start.
#[test]
fn the_batch_count_leaves_out_images_known_to_be_unreadable() {
    let dir = TempDir::new("batch-count");
    for i in 0..300 {
        tiny(&dir.join(format!("ok-{i:03}.png")));
    }
    for name in ["bad-1.png", "bad-2.png"] {
        std::fs::write(dir.join(name), b"not an image at all").expect("write");
    }
    let mut pipeline = Pipeline::builder()
        .source(Source::directory(dir.path()).expect("list"))
        .batch_size(150)
        .resize(ResizeMode::stretch(8, 8))
        .device(Device::Cpu)
        .build()
        .expect("build");
    assert_eq!(pipeline.batches_per_epoch(), 3, "nothing read yet");
    for epoch in 0..2 {
        let batches = (&mut pipeline)
            .inspect(|b| assert!(b.is_ok(), "{b:?}"))
            .count();
        assert_eq!(batches, 2, "epoch {epoch}");
        assert_eq!(pipeline.batches_per_epoch(), 2, "after epoch {epoch}");
    }
    // A shard whose second member is cut short: its damaged part is known from the listing.
    let shards = dir.join("shards");
    std::fs::create_dir(&shards).expect("dir");
    let members = dir.join("members");
    std::fs::create_dir(&members).expect("dir");
    for i in 0..3 {
        tiny(&members.join(format!("s{i}.png")));
    }
    let status = std::process::Command::new("tar")
        .arg("-cf")
        .arg(shards.join("a.tar"))
        .arg("-C")
        .arg(&members)
        .args(["s0.png", "s1.png", "s2.png"])
        .status()
        .expect("tar");
    assert!(status.success());
    let shard = shards.join("a.tar");
    let bytes = std::fs::read(&shard).expect("shard");
    let cut = bytes
        .windows(6)
        .position(|w| w == b"s2.png")
        .expect("third header")
        + 600;
    std::fs::write(&shard, &bytes[..cut]).expect("cut");
    let source = Source::webdataset(&shards).expect("shards");
    let damaged = source.len();
    let pipeline = Pipeline::builder()
        .source(source)
        .batch_size(1)
        .resize(ResizeMode::stretch(8, 8))
        .device(Device::Cpu)
        .build()
        .expect("build");
    let mut pipeline = pipeline;
    // Three listed, the third damaged: two batches of one.
    assert_eq!(damaged, 3);
    assert_eq!(pipeline.batches_per_epoch(), 2);
    let batches = (&mut pipeline)
        .inspect(|b| assert!(b.is_ok(), "{b:?}"))
        .count();
    assert_eq!(batches, 2);
}
