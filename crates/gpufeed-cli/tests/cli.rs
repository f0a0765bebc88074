//! The `gpufeed` command line, run as a user would. On a machine without a GPU `run` falls back
//! to the CPU with a message; `--cpu` makes the tests independent of the machine.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{repo_path, repo_root, TempDir};

/// The binary cargo built, or the bundled copy when the tests were carried to another machine.
fn binary() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_gpufeed"));
    let bundled = repo_path(".gpu/bin/bin-gpufeed");
    if !built.exists() && bundled.exists() {
        bundled
    } else {
        built
    }
}

/// Runs the command line from the repository's root, as the README does.
fn gpufeed(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("run gpufeed")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn last_json(o: &Output) -> serde_json::Value {
    let out = stdout(o);
    let line = out.lines().last().expect("a last line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {line}"))
}

fn temp_dir(name: &str) -> TempDir {
    TempDir::new(name)
}

/// Reads a .npy written by `--save`: (descr, shape, data bytes).
fn read_npy(path: &Path) -> (String, Vec<usize>, Vec<u8>) {
    let bytes = std::fs::read(path).expect("npy");
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = String::from_utf8_lossy(&bytes[10..10 + header_len]).into_owned();
    let descr = header.split("'descr': '").nth(1).expect("descr")[..3].to_string();
    let shape_text = header
        .split("'shape': (")
        .nth(1)
        .expect("shape")
        .split(')')
        .next()
        .expect("shape end");
    let shape = shape_text
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    (descr, shape, bytes[10 + header_len..].to_vec())
}

#[test]
fn run_prints_a_json_summary_and_saves_every_image_in_order() {
    let dir = temp_dir("save");
    let npy = dir.join("out.npy");
    let o = gpufeed(&[
        "run",
        "assets",
        "--cpu",
        "--batch-size",
        "3",
        "--dtype",
        "f32",
        "--layout",
        "nhwc",
        "--json",
        "--save",
        npy.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = last_json(&o);
    assert_eq!(summary["images"], 7);
    assert_eq!(summary["skipped"], 0);
    assert_eq!(summary["batches"], 3);
    assert_eq!(summary["errors"].as_array().expect("errors").len(), 0);
    assert_eq!(summary["f32_bytes"], 7 * 224 * 224 * 3 * 4);
    for key in ["seconds", "images_per_s", "uploaded_bytes"] {
        assert!(summary[key].is_number(), "{key}");
    }
    let first = summary["first_batch_seconds"]
        .as_f64()
        .expect("first_batch_seconds");
    let whole = summary["setup_seconds"].as_f64().expect("setup_seconds")
        + summary["seconds"].as_f64().expect("seconds");
    assert!(first > 0.0 && first <= whole, "{first} of {whole}");
    let (descr, shape, data) = read_npy(&npy);
    assert_eq!(descr, "<f4");
    assert_eq!(shape, vec![7, 224, 224, 3]);
    assert_eq!(data.len(), 7 * 224 * 224 * 3 * 4);
    let paths = std::fs::read_to_string(dir.join("out.paths.txt")).expect("paths");
    let paths: Vec<&str> = paths.lines().collect();
    assert_eq!(paths.len(), 7);
    assert!(paths[0].ends_with("astronaut.png") && paths[6].ends_with("rocket.jpg"));
}

#[test]
fn saved_output_matches_the_library_output() {
    let dir = temp_dir("match");
    let npy = dir.join("out.npy");
    let o = gpufeed(&[
        "run",
        "assets",
        "--cpu",
        "--save",
        npy.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success());
    let (descr, shape, data) = read_npy(&npy);
    assert_eq!(descr, "<f2");
    assert_eq!(shape, vec![7, 3, 224, 224]);
    let mut pipeline = gpufeed::Pipeline::builder()
        .source(gpufeed::Source::directory(repo_path("assets")).expect("assets"))
        .device(gpufeed::Device::Cpu)
        .build()
        .expect("build");
    let batch = pipeline.next_batch().expect("batch").expect("one batch");
    assert_eq!(batch.images().to_host().expect("host").to_le_bytes(), data);
}

#[test]
fn bad_files_are_listed_with_path_and_reason() {
    let dir = temp_dir("bad");
    std::fs::copy(repo_path("assets/rocket.jpg"), dir.join("good.jpg")).expect("copy");
    std::fs::write(dir.join("broken.jpg"), b"not a jpeg").expect("write");
    let o = gpufeed(&["run", dir.to_str().expect("path"), "--cpu", "--json"]);
    assert!(o.status.success());
    let summary = last_json(&o);
    assert_eq!(summary["images"], 1);
    assert_eq!(summary["skipped"], 1);
    let error = &summary["errors"][0];
    assert!(error["path"]
        .as_str()
        .expect("path")
        .ends_with("broken.jpg"));
    assert!(error["reason"]
        .as_str()
        .expect("reason")
        .contains("not a JPEG"));

    let o = gpufeed(&[
        "run",
        dir.to_str().expect("path"),
        "--cpu",
        "--on-error",
        "fail",
    ]);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("broken.jpg"), "{stderr}");
}

#[test]
fn no_arguments_runs_on_the_bundled_assets() {
    let o = gpufeed(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = stdout(&o);
    assert!(out.contains("images      7"), "{out}");
    // What to try next, after the summary.
    assert!(out.contains("next: your own images"), "{out}");
    assert!(out.contains("gpufeed run DIR"), "{out}");
    // The hint for every option names the help that lists them all.
    assert!(out.contains("gpufeed run --help-all"), "{out}");
    if gpufeed::cuda::probe().is_err() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("CUDA is not available"), "{err}");
        assert!(err.contains("CPU"), "{err}");
    } else {
        assert!(
            out.contains("u8/f32"),
            "the upload comparison runs with a GPU: {out}"
        );
    }
}

#[test]
fn missing_folder_is_an_error_not_a_panic() {
    let o = gpufeed(&["run", "no/such/folder", "--cpu"]);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("no/such/folder"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bench_without_a_gpu_says_so_and_fails() {
    if gpufeed::cuda::probe().is_ok() {
        return; // covered by the GPU machine's bench run
    }
    let o = gpufeed(&["bench"]);
    assert!(
        !o.status.success(),
        "nothing was measured: the exit says so"
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("nothing to measure"), "{stderr}");
}

/// The whole of stdout is one JSON object under `--json`, under either error policy; under
/// `--on-error fail` it carries the error and the exit status is a failure.
#[test]
fn json_is_all_of_stdout_under_every_policy() {
    let dir = temp_dir("json");
    std::fs::copy(repo_path("assets/rocket.jpg"), dir.join("a.jpg")).expect("copy");
    std::fs::write(dir.join("b.jpg"), b"not a jpeg").expect("write");
    for (policy, ok) in [("skip", true), ("fail", false)] {
        let o = gpufeed(&[
            "run",
            dir.to_str().expect("path"),
            "--cpu",
            "--json",
            "--on-error",
            policy,
        ]);
        assert_eq!(o.status.success(), ok, "{policy}");
        let out = stdout(&o);
        let value: serde_json::Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("{policy}: stdout is not one JSON object ({e}): {out}"));
        if ok {
            assert_eq!(value["images"], 1);
            assert_eq!(value["skipped"], 1);
        } else {
            assert!(
                value["error"].as_str().expect("error").contains("b.jpg"),
                "{value}"
            );
        }
    }
}

/// A folder without images is a failure with a reason, not a success with 0 images.
#[test]
fn a_folder_without_images_fails() {
    let dir = temp_dir("noimages");
    std::fs::write(dir.join("readme.txt"), "no images").expect("write");
    let o = gpufeed(&["run", dir.to_str().expect("path"), "--cpu"]);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("no image file"), "{stderr}");
}

/// `--save` files are complete or absent: a failed run leaves none, an existing file is kept
/// unless `--overwrite`, and an input of the run is never written over.
#[test]
fn save_is_complete_or_absent_and_never_clobbers() {
    let dir = temp_dir("atomic");
    let images = dir.join("images");
    std::fs::create_dir(&images).expect("dir");
    std::fs::copy(repo_path("assets/rocket.jpg"), images.join("a.jpg")).expect("copy");
    std::fs::write(images.join("b.jpg"), b"not a jpeg").expect("write");
    let npy = dir.join("out.npy");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "run".to_string(),
            images.display().to_string(),
            "--cpu".into(),
            "--save".into(),
            npy.display().to_string(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        gpufeed(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let failed = run(&["--on-error", "fail"]);
    assert!(!failed.status.success());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(leftovers, ["images"], "a failed run leaves no file");
    assert!(run(&[]).status.success());
    let (_, shape, _) = read_npy(&npy);
    assert_eq!(shape[0], 1);
    let again = run(&[]);
    assert!(!again.status.success(), "an existing --save file is kept");
    assert!(String::from_utf8_lossy(&again.stderr).contains("--overwrite"));
    assert!(run(&["--overwrite"]).status.success());
    let input = images.join("a.jpg");
    let clobber = gpufeed(&[
        "run",
        images.to_str().expect("path"),
        "--cpu",
        "--overwrite",
        "--save",
        input.to_str().expect("path"),
    ]);
    assert!(!clobber.status.success());
    assert_eq!(
        std::fs::read(&input).expect("input"),
        std::fs::read(repo_path("assets/rocket.jpg")).expect("rocket"),
        "the input is untouched"
    );
}

/// Every row of the paths file is one line, whatever the names hold.
#[test]
fn paths_file_keeps_one_row_per_line() {
    let dir = temp_dir("rows");
    let images = dir.join("images");
    std::fs::create_dir(&images).expect("dir");
    std::fs::copy(
        repo_path("assets/rocket.jpg"),
        images.join("line\nbreak.jpg"),
    )
    .expect("copy");
    std::fs::copy(repo_path("assets/rocket.jpg"), images.join("plain.jpg")).expect("copy");
    let npy = dir.join("out.npy");
    let o = gpufeed(&[
        "run",
        images.to_str().expect("path"),
        "--cpu",
        "--save",
        npy.to_str().expect("path"),
    ]);
    assert!(o.status.success());
    let text = std::fs::read_to_string(dir.join("out.paths.txt")).expect("paths");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text:?}");
    assert!(lines[0].ends_with("line\\nbreak.jpg"), "{text:?}");
}

/// Peak memory over a folder of images just under the pixel limit stays within the documented
/// bound, `decode_memory + threads * 2 MB` over the process's base (and 32 MB for the staging
/// and the allocator's slack), at 2, 8 and 64 threads,
/// where each image alone takes over 40 MB to decode.
#[test]
fn decode_memory_bounds_peak_memory_whatever_the_threads() {
    let dir = temp_dir("bound");
    let image = image::ImageBuffer::<image::Rgba<u16>, Vec<u16>>::from_fn(1990, 1990, |x, y| {
        image::Rgba([
            (x * 33) as u16,
            (y * 31) as u16,
            ((x + y) * 7) as u16,
            65535,
        ])
    });
    let first = dir.join("big_00.png");
    image.save(&first).expect("png");
    for i in 1..64 {
        std::fs::hard_link(&first, dir.join(format!("big_{i:02}.png"))).expect("link");
    }
    let decode_memory: u64 = 100 << 20;
    let base = {
        let o = gpufeed(&[
            "run",
            "assets",
            "--cpu",
            "--json",
            "--threads",
            "1",
            "--resize-mode",
            "stretch",
            "--size",
            "64x64",
        ]);
        last_json(&o)["peak_rss_bytes"].as_u64().expect("rss")
    };
    for threads in [2u64, 8, 64] {
        let o = gpufeed(&[
            "run",
            dir.to_str().expect("path"),
            "--cpu",
            "--json",
            "--threads",
            &threads.to_string(),
            "--batch-size",
            "64",
            "--resize-mode",
            "stretch",
            "--size",
            "64x64",
            "--max-pixels",
            "4000000",
            "--decode-memory",
            &decode_memory.to_string(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let summary = last_json(&o);
        assert_eq!(summary["images"], 64);
        let peak = summary["peak_rss_bytes"].as_u64().expect("rss");
        let bound = base + decode_memory + threads * (2 << 20) + (32 << 20);
        println!(
            "{threads} threads: peak {} MB, bound {} MB",
            peak >> 20,
            bound >> 20
        );
        assert!(peak <= bound, "{threads} threads: peak {peak} over {bound}");
    }
}

/// A PNG chunk: length, type, data and CRC.
fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc = 0xFFFF_FFFFu32;
    for &b in kind.iter().chain(data) {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    out.extend_from_slice(&(!crc).to_be_bytes());
    out
}

/// A zlib stream of `bytes` zeros, made a MiB at a time.
fn zlib_zeros(bytes: usize) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..bytes >> 20 {
        encoder.write_all(&zeros).expect("deflate");
    }
    encoder.finish().expect("deflate")
}

/// PNGs that attack the decoder's memory through their metadata chunks, whose pixels are a
/// plain 32x32 image: a colour profile (iCCP) that inflates to 256 MiB, compressed text
/// (zTXt, iTXt) that does too, 100,000 text chunks, and an EXIF chunk of 16 MB. Decoded by 16
/// threads, they keep the process's peak memory within `decode_memory` + the staging + 200 MB
/// over its base, and every one of them is delivered, with or without EXIF orientation.
#[test]
fn hostile_png_metadata_stays_within_the_decode_memory() {
    let dir = temp_dir("hostile-png");
    let mut plain = Vec::new();
    image::RgbImage::from_fn(32, 32, |x, y| image::Rgb([x as u8 * 8, y as u8 * 8, 99]))
        .write_to(
            &mut std::io::Cursor::new(&mut plain),
            image::ImageFormat::Png,
        )
        .expect("png");
    // The signature and IHDR come first; the metadata goes right after them.
    let (head, rest) = plain.split_at(33);
    let inflating = zlib_zeros(256 << 20);
    let with = |chunks: Vec<Vec<u8>>| [head.to_vec(), chunks.concat(), rest.to_vec()].concat();
    let files = [
        (
            "iccp",
            with(vec![png_chunk(
                b"iCCP",
                &[&b"profile\0\0"[..], &inflating].concat(),
            )]),
        ),
        (
            "ztxt",
            with(vec![png_chunk(
                b"zTXt",
                &[&b"Comment\0\0"[..], &inflating].concat(),
            )]),
        ),
        (
            "itxt",
            with(vec![png_chunk(
                b"iTXt",
                &[&b"Comment\0\x01\0\0\0"[..], &inflating].concat(),
            )]),
        ),
        (
            "text",
            with((0..100_000).map(|_| png_chunk(b"tEXt", b"k\0v")).collect()),
        ),
        ("exif", with(vec![png_chunk(b"eXIf", &vec![0; 16 << 20])])),
    ];
    for (name, bytes) in &files {
        let first = dir.join(format!("{name}_0.png"));
        std::fs::write(&first, bytes).expect("write");
        for i in 1..8 {
            std::fs::hard_link(&first, dir.join(format!("{name}_{i}.png"))).expect("link");
        }
    }
    let decode_memory: u64 = 64 << 20;
    let common = [
        "--cpu",
        "--json",
        "--resize-mode",
        "stretch",
        "--size",
        "64x64",
    ];
    let base = {
        let o = gpufeed(&[&["run", "assets", "--threads", "1"][..], &common].concat());
        last_json(&o)["peak_rss_bytes"].as_u64().expect("rss")
    };
    let decode_memory_arg = decode_memory.to_string();
    for exif in [false, true] {
        let mut args = vec![
            "run",
            dir.to_str().expect("path"),
            "--threads",
            "16",
            "--batch-size",
            "40",
            "--decode-memory",
            &decode_memory_arg,
        ];
        args.extend(common);
        if exif {
            args.push("--exif-orientation");
        }
        let o = gpufeed(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let summary = last_json(&o);
        assert_eq!(summary["images"], 40, "{summary}");
        assert_eq!(summary["skipped"], 0, "{summary}");
        let peak = summary["peak_rss_bytes"].as_u64().expect("rss");
        // The staging and the batch on the CPU device: 40 images of 64x64, as u8 and f16.
        let staging = 40 * 64 * 64 * 3 * 3;
        let bound = base + decode_memory + staging + (200 << 20);
        println!(
            "exif orientation {exif}: peak {} MB, bound {} MB",
            peak >> 20,
            bound >> 20
        );
        assert!(peak <= bound, "peak {peak} over {bound}");
    }
}

/// `--train --seed N --save out.npy` writes `out.crops.tsv`: one row per output row, the path and
/// the arguments of torchvision's `F.resized_crop` and `F.hflip`; the same seed, the same rows.
#[test]
fn train_writes_the_draws_of_every_row() {
    let dir = temp_dir("train");
    let save = |name: &str| {
        let npy = dir.join(name);
        let o = gpufeed(&[
            "run",
            "assets",
            "--cpu",
            "--train",
            "--seed",
            "7",
            "--crop",
            "64",
            "--batch-size",
            "3",
            "--save",
            npy.to_str().expect("utf-8"),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let crops = std::fs::read_to_string(dir.join(name.replace(".npy", ".crops.tsv")))
            .expect("crops.tsv");
        let paths = std::fs::read_to_string(dir.join(name.replace(".npy", ".paths.txt")))
            .expect("paths.txt");
        (crops, paths, std::fs::read(&npy).expect("npy"))
    };
    let (crops, paths, npy) = save("a.npy");
    let rows: Vec<Vec<&str>> = crops.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), 7);
    for (row, path) in rows.iter().zip(paths.lines()) {
        assert_eq!(row.len(), 6, "{row:?}");
        assert_eq!(row[0], path);
        let (w, h) = image::image_dimensions(repo_path(row[0])).expect("size");
        let n: Vec<u32> = row[1..5]
            .iter()
            .map(|v| v.parse().expect("number"))
            .collect();
        let (top, left, height, width) = (n[0], n[1], n[2], n[3]);
        assert!(
            width > 0 && height > 0 && left + width <= w && top + height <= h,
            "{row:?}"
        );
        assert!(row[5] == "0" || row[5] == "1");
    }
    let (again, _, npy_again) = save("b.npy");
    assert_eq!(crops, again, "the same seed draws the same boxes");
    assert!(npy == npy_again, "and the same pixels");
}

/// WebDataset shards with `.cls` labels: `--webdataset` reads them, `--save` writes the labels.
#[test]
fn webdataset_shards_run_and_save_their_labels() {
    let dir = temp_dir("wds");
    let members = dir.join("m");
    std::fs::create_dir_all(&members).expect("mkdir");
    for (i, photo) in ["rocket.jpg", "coffee.png", "chelsea.png"]
        .iter()
        .enumerate()
    {
        let ext = photo.rsplit_once('.').map(|(_, e)| e).unwrap_or("jpg");
        std::fs::copy(
            repo_path(&format!("assets/{photo}")),
            members.join(format!("k{i}.{ext}")),
        )
        .expect("copy");
        std::fs::write(members.join(format!("k{i}.cls")), format!("{}", 4 - i)).expect("cls");
    }
    let shards = dir.join("shards");
    std::fs::create_dir_all(&shards).expect("mkdir");
    let status = Command::new("tar")
        .arg("-cf")
        .arg(shards.join("s-0.tar"))
        .arg("-C")
        .arg(&members)
        .args(["k0.jpg", "k0.cls", "k1.png", "k1.cls", "k2.png", "k2.cls"])
        .status()
        .expect("tar");
    assert!(status.success());
    let npy = dir.join("w.npy");
    let o = gpufeed(&[
        "run",
        shards.to_str().expect("utf-8"),
        "--webdataset",
        "--cpu",
        "--json",
        "--save",
        npy.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(last_json(&o)["images"], 3);
    let labels = std::fs::read_to_string(dir.join("w.labels.txt")).expect("labels");
    assert_eq!(labels, "4\n3\n2\n");
    let paths = std::fs::read_to_string(dir.join("w.paths.txt")).expect("paths");
    assert!(paths.lines().all(|l| l.contains("s-0.tar:k")), "{paths}");
}

/// `--shard RANK/WORLD` evens the ranks out and counts the padding; `--shard env` reads
/// torchrun's variables, and says which are missing; a run that cannot start still prints JSON.
#[test]
fn shards_from_the_command_line_and_the_environment() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        Command::new(binary())
            .args(args)
            .envs(env.iter().copied())
            .current_dir(repo_root())
            .output()
            .expect("run gpufeed")
    };
    let mut images = Vec::new();
    for rank in 0..3 {
        let shard = format!("{rank}/3");
        let o = run(
            &["run", "assets", "--cpu", "--json", "--shard", &shard],
            &[],
        );
        assert!(o.status.success());
        let j = last_json(&o);
        assert_eq!(j["shard"], shard.as_str());
        images.push((j["images"].as_u64(), j["padded"].as_u64()));
    }
    // 7 images on 3 ranks: 3 each, two of the rows padding.
    assert_eq!(
        images,
        vec![(Some(3), Some(0)), (Some(3), Some(1)), (Some(3), Some(1))]
    );
    let o = run(
        &["run", "assets", "--cpu", "--json", "--shard", "env"],
        &[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(last_json(&o)["shard"], "1/2");
    let o = run(
        &["run", "assets", "--cpu", "--json", "--shard", "env"],
        &[("RANK", "1"), ("WORLD_SIZE", "2")],
    );
    assert!(!o.status.success());
    let error = last_json(&o)["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(error.contains("LOCAL_RANK"), "{error}");
}

/// A reader that stops reading (`gpufeed run DIR | head -1`) ends the run quietly, with success,
/// rather than a panic about a broken pipe.
#[test]
fn a_reader_that_goes_away_ends_the_run_quietly() {
    let mut child = Command::new(binary())
        .args(["run", "assets", "--cpu", "--epochs", "3"])
        .current_dir(repo_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run gpufeed");
    // The read end closed before the first line is written.
    drop(child.stdout.take());
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A folder that takes a few seconds on one thread: hard links to one large PNG.
fn slow_folder(name: &str, copies: usize) -> TempDir {
    let dir = temp_dir(name);
    let images = dir.join("images");
    std::fs::create_dir(&images).expect("dir");
    let first = images.join("big_000.png");
    image::RgbImage::from_fn(1500, 1500, |x, y| {
        image::Rgb([(x * 7) as u8, (y * 3) as u8, (x ^ y) as u8])
    })
    .save(&first)
    .expect("png");
    for i in 1..copies {
        std::fs::hard_link(&first, images.join(format!("big_{i:03}.png"))).expect("link");
    }
    dir
}

/// Ctrl-C (SIGINT) in the middle of a run: the run stops within moments, removes what `--save`
/// had begun to write, prints the summary so far (JSON with `--json`) and exits with 130.
#[test]
fn ctrl_c_stops_the_run_cleanly_and_exits_130() {
    let dir = slow_folder("sigint", 400);
    let npy = dir.join("out.npy");
    for json in [true, false] {
        let mut args = vec![
            "run".to_string(),
            dir.join("images").display().to_string(),
            "--cpu".into(),
            "--threads".into(),
            "1".into(),
            "--batch-size".into(),
            "4".into(),
            "--save".into(),
            npy.display().to_string(),
        ];
        if json {
            args.push("--json".into());
        }
        let child = Command::new(binary())
            .args(&args)
            .current_dir(repo_root())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start gpufeed");
        // Wait for the run to be under way: its .npy being written.
        let started = std::time::Instant::now();
        let partial = |dir: &Path| {
            std::fs::read_dir(dir)
                .expect("dir")
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().contains("partial"))
                .count()
        };
        while partial(&dir) == 0 {
            assert!(started.elapsed().as_secs() < 60, "the run did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let sent = std::time::Instant::now();
        let kill = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(kill.success());
        let o = child.wait_with_output().expect("wait");
        let took = sent.elapsed();
        assert_eq!(
            o.status.code(),
            Some(130),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(took.as_secs_f64() < 5.0, "stopped {took:?} after Ctrl-C");
        assert_eq!(partial(&dir), 0, "a partial file is left");
        assert!(!npy.exists());
        let out = stdout(&o);
        if json {
            let summary = last_json(&o);
            assert_eq!(summary["interrupted"], true, "{summary}");
            assert!(summary["images"].as_u64().expect("images") < 400);
            assert!(summary["error"]
                .as_str()
                .expect("error")
                .contains("interrupted"));
        } else {
            assert!(out.contains("interrupted"), "{out}");
            assert!(out.contains("images/s"), "{out}");
        }
    }
}

/// `--scale`, `--ratio`, `--mean` and `--std` take their values as the help says (`MIN,MAX`) and
/// as separate words; a wrong count, a size with no pixels and other mistakes name the flag and
/// say the size as given.
#[test]
fn value_lists_parse_both_ways_and_mistakes_name_the_flag() {
    let common = [
        "run", "assets", "--cpu", "--json", "--train", "--size", "32x32",
    ];
    for extra in [
        &["--scale", "0.5,1", "--ratio", "0.75,1.25"][..],
        &["--scale", "0.5", "1", "--ratio", "0.75", "1.25"][..],
        &["--mean", "0.5,0.5,0.5", "--std", "0.25", "0.25", "0.25"][..],
    ] {
        let o = gpufeed(&[&common[..], extra].concat());
        assert!(
            o.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(last_json(&o)["images"], 7);
    }
    let o = gpufeed(&[&common[..], &["--scale", "0.5"]].concat());
    assert!(!o.status.success());
    assert!(
        stdout(&o).contains("--scale takes two values"),
        "{}",
        stdout(&o)
    );
    let o = gpufeed(&["run", "assets", "--cpu", "--size", "0x224"]);
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("--size") && stderr.contains("0x224 (height x width)"),
        "{stderr}"
    );
    let o = gpufeed(&["run", "assets", "--cpu", "--hflip", "2"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("--hflip"), "{stderr}");
    let o = gpufeed(&["run", "assets", "--cpu", "--decode-memory", "0"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("--decode-memory"), "{stderr}");
}

/// A run in which every image is skipped fails (and says why), in words and in JSON.
#[test]
fn a_run_that_delivers_nothing_fails() {
    let dir = temp_dir("all-bad");
    for name in ["a.jpg", "b.png"] {
        std::fs::write(dir.join(name), b"not an image at all").expect("write");
    }
    for json in [false, true] {
        let mut args = vec!["run", dir.to_str().expect("path"), "--cpu"];
        if json {
            args.push("--json");
        }
        let o = gpufeed(&args);
        assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
        if json {
            let summary = last_json(&o);
            assert_eq!(summary["skipped"], 2);
            assert!(summary["error"]
                .as_str()
                .expect("error")
                .contains("every image was skipped"));
        } else {
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert!(stderr.contains("every image was skipped"), "{stderr}");
            assert!(stdout(&o).contains("not a JPEG"), "{}", stdout(&o));
        }
    }
}

/// An ImageFolder run saves the class names beside the labels; names with a tab, a newline or
/// bytes that are not UTF-8 stay one row and one column in every file, and the `saved` line
/// names every file written.
#[test]
fn save_writes_classes_and_escapes_every_name() {
    use std::os::unix::ffi::OsStrExt;
    let dir = temp_dir("classes");
    let root = dir.join("root");
    for (class, name) in [
        (&b"cat"[..], &b"tab\there.jpg"[..]),
        (b"cat", b"latin1-\xe9.jpg"),
        (b"dog", b"line\nbreak.jpg"),
    ] {
        let folder = root.join(std::ffi::OsStr::from_bytes(class));
        std::fs::create_dir_all(&folder).expect("dir");
        std::fs::copy(
            repo_path("assets/rocket.jpg"),
            folder.join(std::ffi::OsStr::from_bytes(name)),
        )
        .expect("copy");
    }
    let npy = dir.join("out.npy");
    let o = gpufeed(&[
        "run",
        root.to_str().expect("path"),
        "--image-folder",
        "--resize-mode",
        "random-resized-crop",
        "--cpu",
        "--size",
        "32x32",
        "--save",
        npy.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = stdout(&o);
    let saved = out
        .lines()
        .find(|l| l.contains("saved"))
        .expect("saved line");
    for suffix in [
        "out.npy",
        "out.paths.txt",
        "out.labels.txt",
        "out.crops.tsv",
        "out.classes.txt",
    ] {
        assert!(saved.contains(suffix), "{saved}");
        assert!(dir.join(suffix).exists(), "{suffix}");
    }
    let read = |suffix: &str| std::fs::read_to_string(dir.join(suffix)).expect("read");
    assert_eq!(read("out.classes.txt"), "cat\ndog\n");
    assert_eq!(read("out.labels.txt"), "0\n0\n1\n");
    let paths = read("out.paths.txt");
    let rows: Vec<&str> = paths.lines().collect();
    assert_eq!(rows.len(), 3, "{paths:?}");
    assert!(rows[0].ends_with("cat/latin1-\\xe9.jpg"), "{paths:?}");
    assert!(rows[1].ends_with("cat/tab\\there.jpg"), "{paths:?}");
    assert!(rows[2].ends_with("dog/line\\nbreak.jpg"), "{paths:?}");
    // The rows name files that open, once unescaped.
    for row in &rows {
        let mut bytes = Vec::new();
        let mut chars = row.bytes();
        while let Some(b) = chars.next() {
            if b != b'\\' {
                bytes.push(b);
                continue;
            }
            match chars.next() {
                Some(b't') => bytes.push(b'\t'),
                Some(b'n') => bytes.push(b'\n'),
                Some(b'r') => bytes.push(b'\r'),
                Some(b'x') => {
                    let hex: Vec<u8> = chars.by_ref().take(2).collect();
                    let text = std::str::from_utf8(&hex).expect("hex");
                    bytes.push(u8::from_str_radix(text, 16).expect("hex"));
                }
                Some(other) => bytes.push(other),
                None => {}
            }
        }
        let path = Path::new(std::ffi::OsStr::from_bytes(&bytes));
        let path = if path.is_absolute() {
            path.to_path_buf()
        } else {
            repo_root().join(path)
        };
        assert!(path.is_file(), "{row:?} does not name a file");
    }
    for line in read("out.crops.tsv").lines() {
        assert_eq!(line.split('\t').count(), 6, "{line:?}");
    }
}

/// Nothing is lost without a word: a folder's files of other kinds are counted by extension,
/// GIFs are listed, and a WebDataset shard with a sample without a label, links, a duplicate
/// key and a truncated tail accounts for every sample in the JSON.
#[test]
fn every_file_and_member_is_accounted_for_in_the_json() {
    let dir = temp_dir("accounted");
    let folder = dir.join("folder");
    std::fs::create_dir(&folder).expect("dir");
    std::fs::copy(
        repo_path("tests/fixtures/animated.gif"),
        folder.join("a.gif"),
    )
    .expect("gif");
    std::fs::copy(repo_path("assets/rocket.jpg"), folder.join("b.jpg")).expect("jpg");
    std::fs::write(folder.join("notes.txt"), "x").expect("txt");
    std::fs::write(folder.join("README"), "x").expect("readme");
    let o = gpufeed(&["run", folder.to_str().expect("path"), "--cpu", "--json"]);
    assert!(o.status.success());
    let summary = last_json(&o);
    assert_eq!(summary["images"], 2, "{summary}");
    assert_eq!(summary["left_out"]["txt"], 1, "{summary}");
    assert_eq!(summary["left_out"][""], 1, "{summary}");

    let members = dir.join("m");
    std::fs::create_dir(&members).expect("dir");
    let put = |name: &str, from: &str| {
        std::fs::copy(repo_path(from), members.join(name)).expect("copy");
    };
    put("a.jpg", "assets/rocket.jpg");
    std::fs::write(members.join("a.cls"), "1").expect("cls");
    put("b.png", "assets/chelsea.png");
    std::fs::hard_link(members.join("a.jpg"), members.join("c.jpg")).expect("link");
    std::fs::write(members.join("c.cls"), "3").expect("cls");
    std::fs::write(members.join("b.cls"), "2").expect("cls");
    std::os::unix::fs::symlink("a.jpg", members.join("d.jpg")).expect("symlink");
    std::fs::write(members.join("d.cls"), "4").expect("cls");
    std::os::unix::fs::symlink("/etc/hostname", members.join("e.jpg")).expect("symlink");
    std::fs::write(members.join("e.cls"), "5").expect("cls");
    put("f.jpg", "assets/coffee.png");
    let shards = dir.join("shards");
    std::fs::create_dir(&shards).expect("dir");
    let shard = shards.join("s-0.tar");
    // b.png's label comes after its image; f has no label; a comes again at the end.
    let status = Command::new("tar")
        .arg("-cf")
        .arg(&shard)
        .arg("-C")
        .arg(&members)
        .args([
            "a.jpg", "a.cls", "b.png", "b.cls", "c.jpg", "c.cls", "d.jpg", "d.cls", "e.jpg",
            "e.cls", "f.jpg", "a.jpg",
        ])
        .status()
        .expect("tar");
    assert!(status.success());
    // A second shard cut short inside f.jpg's data.
    let mut cut = std::fs::read(&shard).expect("shard");
    let f_header = cut
        .windows(6)
        .position(|w| w == b"f.jpg\0")
        .expect("f.jpg's header");
    cut.truncate(f_header + 512 + 100);
    std::fs::write(shards.join("s-1.tar"), &cut).expect("cut");
    let o = gpufeed(&[
        "run",
        shards.to_str().expect("path"),
        "--webdataset",
        "--cpu",
        "--json",
        "--batch-size",
        "3",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = last_json(&o);
    let errors = summary["errors"].as_array().expect("errors");
    let reason = |id_end: &str, shard: &str| {
        errors
            .iter()
            .find(|e| {
                let path = e["path"].as_str().unwrap_or("");
                path.contains(shard) && path.ends_with(id_end)
            })
            .map(|e| e["reason"].as_str().unwrap_or("").to_string())
            .unwrap_or_else(|| panic!("no error for {shard} {id_end}: {summary}"))
    };
    // Shard 0: a, b, c (a hard link), d (a symbolic link) delivered; e (a link out of the
    // shard), f (no label) and the second a (a duplicate key) reported.
    assert!(
        reason(":e.jpg", "s-0").contains("symbolic link"),
        "{summary}"
    );
    assert!(reason(":f.jpg", "s-0").contains(".cls"), "{summary}");
    assert!(
        reason(":a.jpg", "s-0").contains("duplicate key"),
        "{summary}"
    );
    // Shard 1 holds the same up to f.jpg, which the cut makes a truncated member.
    assert!(
        reason(":e.jpg", "s-1").contains("symbolic link"),
        "{summary}"
    );
    assert!(reason(":f.jpg", "s-1").contains("truncated"), "{summary}");
    assert_eq!(summary["images"], 4 + 4, "{summary}");
    assert_eq!(summary["skipped"], 3 + 2, "{summary}");
}

/// The README's command lines on the CPU run as it shows them, from the repository's root.
#[test]
fn the_readme_command_lines_run() {
    let readme = std::fs::read_to_string(repo_path("README.md")).expect("README");
    let dir = temp_dir("readme");
    let out = dir.join("out.npy");
    let lines: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("gpufeed run") && l.contains("--cpu"))
        .collect();
    assert!(lines.len() >= 3, "{lines:?}");
    for line in lines {
        let command = line.split('#').next().expect("command");
        let args: Vec<String> = command
            .split_whitespace()
            .skip(1)
            .map(|a| a.replace("/tmp/out.npy", out.to_str().expect("path")))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = gpufeed(&args);
        assert!(
            o.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert!(out.exists() && dir.join("out.paths.txt").exists());
}

/// `gpufeed run --help` (and `-h`) shows the main options and points to `--help-all`, which
/// shows every option in full; both exit 0.
#[test]
fn run_help_is_short_and_help_all_shows_every_option() {
    let short = gpufeed(&["run", "--help"]);
    assert!(short.status.success());
    let short = String::from_utf8_lossy(&short.stdout).to_string();
    assert_eq!(
        String::from_utf8_lossy(&gpufeed(&["run", "-h"]).stdout),
        short
    );
    assert!(short.lines().count() <= 60, "{short}");
    assert!(short.contains("--batch-size") && short.contains("gpufeed run --help-all"));
    assert!(!short.contains("--assisted-share"), "{short}");
    let all = gpufeed(&["run", "--help-all"]);
    assert!(all.status.success());
    let all = String::from_utf8_lossy(&all.stdout);
    for flag in [
        "--batch-size",
        "--assisted-share",
        "--cache-dir",
        "--pillow-version",
    ] {
        assert!(all.contains(flag), "{flag}: {all}");
    }
    assert!(
        all.contains("FILE.augment.jsonl"),
        "--save's whole description: {all}"
    );
}

/// What `--save FILE.npy` wrote: the rows' bytes, and the lines of the ids, labels and draws.
struct Saved {
    rows: Vec<u8>,
    lines: Vec<Vec<String>>,
}

impl Saved {
    fn read(npy: &Path) -> Saved {
        let (_, _, rows) = read_npy(npy);
        let name = npy.to_str().expect("utf-8");
        let lines = [".paths.txt", ".labels.txt", ".crops.tsv"]
            .iter()
            .map(|suffix| {
                std::fs::read_to_string(name.replace(".npy", suffix))
                    .expect("saved beside the .npy")
                    .lines()
                    .map(str::to_string)
                    .collect()
            })
            .collect();
        Saved { rows, lines }
    }

    fn row_count(&self) -> usize {
        self.lines[0].len()
    }

    /// Rows `from..` of these.
    fn rows_from(&self, from: usize) -> Saved {
        let row_bytes = self.rows.len() / self.row_count().max(1);
        Saved {
            rows: self.rows[from * row_bytes..].to_vec(),
            lines: self.lines.iter().map(|l| l[from..].to_vec()).collect(),
        }
    }

    fn append(&mut self, other: Saved) {
        self.rows.extend(other.rows);
        for (mine, theirs) in self.lines.iter_mut().zip(other.lines) {
            mine.extend(theirs);
        }
    }

    fn assert_same(&self, other: &Saved, what: &str) {
        for (mine, theirs) in self.lines.iter().zip(&other.lines) {
            assert_eq!(mine, theirs, "{what}");
        }
        assert!(self.rows == other.rows, "{what}: the rows' bytes differ");
    }
}

/// `gpufeed run` of training crops over an ImageFolder in `dir`, 2 epochs, with `more` (seed 5
/// unless `more` gives one).
fn train_run(dir: &Path, more: &[&str]) -> Output {
    let mut args = vec![
        "run",
        dir.to_str().expect("utf-8"),
        "--image-folder",
        "--cpu",
        "--train",
    ];
    if !more.contains(&"--seed") {
        args.extend(["--seed", "5"]);
    }
    args.extend([
        "--crop",
        "24",
        "--batch-size",
        "4",
        "--epochs",
        "2",
        "--json",
    ]);
    args.extend_from_slice(more);
    gpufeed(&args)
}

/// `--max-batches` stops cleanly with exactly those rows saved and the state written; `--resume`
/// goes on from there, across an epoch's end, and the pieces together are the uninterrupted run.
#[test]
fn max_batches_then_resume_save_the_rows_of_an_uninterrupted_run() {
    let dir = temp_dir("resume-pieces");
    let images = dir.join("images");
    common::generated_image_folder(&images, 20, 2);
    let path = |name: &str| dir.join(name).to_str().expect("utf-8").to_string();
    let o = train_run(&images, &["--save", &path("whole.npy")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let whole = Saved::read(&dir.join("whole.npy"));
    assert_eq!(whole.row_count(), 40, "20 images twice");
    let state = path("state.json");
    let mut pieces: Option<Saved> = None;
    // 5 batches (the first epoch's last one included), 3 more (into the second epoch), the rest.
    for (n, max) in [Some("5"), Some("3"), None].into_iter().enumerate() {
        let npy = path(&format!("piece{n}.npy"));
        let mut more = vec!["--state", &state, "--save", &npy];
        if n > 0 {
            more.extend(["--resume", &state]);
        }
        if let Some(max) = max {
            more.extend(["--max-batches", max]);
        }
        let o = train_run(&images, &more);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let summary = last_json(&o);
        let piece = Saved::read(Path::new(&npy));
        if let Some(max) = max {
            assert_eq!(
                summary["batches"],
                max.parse::<u64>().expect("n"),
                "{summary}"
            );
            assert_eq!(piece.row_count(), 4 * max.parse::<usize>().expect("n"));
        }
        match &mut pieces {
            None => pieces = Some(piece),
            Some(all) => all.append(piece),
        }
    }
    pieces
        .expect("pieces")
        .assert_same(&whole, "the pieces together");
    // At the end, the state is the beginning of epoch 2: a resume has nothing left to do.
    let o = train_run(&images, &["--resume", &state]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(last_json(&o)["images"], 0);
    assert_eq!(last_json(&o)["state"]["epoch"], 2);
}

/// A run killed with SIGKILL once its state file is written, resumed from that file: the rows
/// after the state are, row for row, the uninterrupted run's.
#[test]
fn a_run_killed_with_sigkill_resumes_row_for_row() {
    killed_and_resumed("resume-kill", 150, "4", &["--cpu", "--threads", "1"]);
}

/// The same in hybrid decoding: the run killed was given the share the uninterrupted run
/// measured, its state records it, and the resumed run (given none) pins it.
#[test]
fn a_hybrid_run_killed_with_sigkill_resumes_row_for_row() {
    if !common::gpu_present("a_hybrid_run_killed_with_sigkill_resumes_row_for_row") {
        return;
    }
    killed_and_resumed(
        "resume-kill-hybrid",
        400,
        "2",
        &["--device", "0", "--decode", "hybrid"],
    );
}

/// Runs 2 epochs of training crops over `images` generated images with `lanes`, uninterrupted;
/// then again, killed with SIGKILL once its state file says three batches are out; then resumed
/// from that file: the rows after the state must be the uninterrupted run's.
fn killed_and_resumed(name: &str, images: usize, batch_size: &str, lanes: &[&str]) {
    let dir = temp_dir(name);
    let folder = dir.join("images");
    common::generated_image_folder(&folder, images, 3);
    let path = |name: &str| dir.join(name).to_str().expect("utf-8").to_string();
    let mut base = vec![
        "run",
        folder.to_str().expect("utf-8"),
        "--image-folder",
        "--train",
        "--seed",
        "5",
        "--crop",
        "24",
        "--batch-size",
        batch_size,
        "--epochs",
        "2",
        "--prefetch",
        "1",
    ];
    base.extend_from_slice(lanes);
    let whole_npy = path("whole.npy");
    let o = gpufeed(&[&base[..], &["--json", "--save", &whole_npy]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = last_json(&o);
    let per_epoch: Vec<usize> = summary["epochs"]
        .as_array()
        .expect("epochs")
        .iter()
        .map(|e| e["images"].as_u64().expect("images") as usize)
        .collect();
    // With hybrid decoding, the run killed takes the share the uninterrupted run measured, or 0
    // where that run ended before the GPU lane joined (its CPU lane decoded every image).
    let hybrid = lanes.contains(&"hybrid");
    let share = match summary["gpu_share"].as_f64() {
        Some(measured) => Some(measured.to_string()),
        None => hybrid.then(|| "0".to_string()),
    };
    let whole = Saved::read(Path::new(&whole_npy));
    let state = path("state.json");
    let mut killed = base.clone();
    if let Some(share) = &share {
        killed.extend(["--gpu-share", share]);
    }
    killed.extend(["--state", &state]);
    let mut child = Command::new(binary())
        .args(&killed)
        .current_dir(repo_root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start gpufeed");
    // Killed as soon as the state says three batches are out.
    let started = std::time::Instant::now();
    loop {
        let batches = std::fs::read_to_string(&state)
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|value| value["batches"].as_u64());
        if batches.is_some_and(|b| b >= 3) {
            break;
        }
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the run ended before it was killed"
        );
        assert!(started.elapsed().as_secs() < 120, "no state written");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state")).expect("whole");
    let epoch = saved["epoch"].as_u64().expect("epoch") as usize;
    assert!(epoch < 2, "killed mid-run: {saved}");
    if let Some(share) = &share {
        assert_eq!(
            saved["gpu_share"].as_f64().map(|s| s.to_string()).as_ref(),
            Some(share)
        );
    }
    let before =
        per_epoch[..epoch].iter().sum::<usize>() + saved["rows"].as_u64().expect("rows") as usize;
    let after_npy = path("after.npy");
    let o = gpufeed(
        &[
            &base[..],
            &["--json", "--resume", &state, "--save", &after_npy],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        last_json(&o)["gpu_share"].as_f64().map(|s| s.to_string()),
        share,
        "the share is pinned"
    );
    Saved::read(Path::new(&after_npy)).assert_same(
        &whole.rows_from(before),
        &format!("resumed after {before} rows"),
    );
    println!("{name}: killed after {before} rows, resumed row for row");
}

/// A state resumed with another seed or output option, or over another folder, is refused,
/// naming what differs; nothing is saved.
#[test]
fn resume_refuses_another_seed_option_or_folder() {
    let dir = temp_dir("resume-refused");
    let images = dir.join("images");
    common::generated_image_folder(&images, 6, 0);
    let state = dir.join("state.json");
    let state = state.to_str().expect("utf-8");
    let o = train_run(&images, &["--max-batches", "1", "--state", state]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (more, says) in [
        (&["--seed", "6"][..], "seed is 6 here but 5 in the state"),
        (
            &["--dtype", "f32"][..],
            "dtype is f32 here but f16 in the state",
        ),
    ] {
        let o = train_run(&images, &[more, &["--resume", state]].concat());
        assert!(!o.status.success());
        let error = last_json(&o)["error"].as_str().expect("error").to_string();
        assert!(error.contains(says), "{error}");
    }
    std::fs::remove_file(images.join("class_0/0000.jpg")).expect("remove");
    let o = train_run(&images, &["--resume", state]);
    assert!(!o.status.success());
    let error = last_json(&o)["error"].as_str().expect("error").to_string();
    assert!(error.contains("source is not the one"), "{error}");
}

/// `--recipe torchvision-imagenet --save`: FILE.augment.jsonl holds one JSON object a row, with
/// its id, its torchvision calls from `resized_crop` on (the crop's arguments those of
/// FILE.crops.tsv), and its batch's mixing with the previous row of the batch.
#[test]
fn recipe_writes_the_calls_and_mixing_of_every_row() {
    let dir = temp_dir("recipe");
    let folder = dir.join("folder");
    for (i, photo) in [
        "chelsea.png",
        "coffee.png",
        "rocket.jpg",
        "camera.png",
        "astronaut.png",
    ]
    .iter()
    .enumerate()
    {
        let class = folder.join(["cat", "dog"][i % 2]);
        std::fs::create_dir_all(&class).expect("class");
        std::fs::copy(repo_path(&format!("assets/{photo}")), class.join(photo)).expect("copy");
    }
    let npy = dir.join("out.npy");
    let o = gpufeed(&[
        "run",
        folder.to_str().expect("utf-8"),
        "--image-folder",
        "--cpu",
        "--recipe",
        "torchvision-imagenet",
        "--crop",
        "48",
        "--batch-size",
        "2",
        "--save",
        npy.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = std::fs::read_to_string(dir.join("out.augment.jsonl")).expect("augment.jsonl");
    let paths = std::fs::read_to_string(dir.join("out.paths.txt")).expect("paths.txt");
    let crops = std::fs::read_to_string(dir.join("out.crops.tsv")).expect("crops.tsv");
    let rows: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(rows.len(), 5);
    for (k, ((row, path), crop)) in rows
        .iter()
        .zip(paths.lines())
        .zip(crops.lines())
        .enumerate()
    {
        assert_eq!(row["row"], k);
        assert_eq!(row["id"], path);
        let calls = row["calls"].as_array().expect("calls");
        let first = &calls[0];
        assert_eq!(first[0], "resized_crop");
        let c: Vec<&str> = crop.split('\t').collect();
        assert_eq!(first[1]["top"].to_string(), c[1]);
        assert_eq!(first[1]["width"].to_string(), c[4]);
        assert_eq!(first[1]["size"], serde_json::json!([48, 48]));
        assert_eq!(calls.iter().any(|c| c[0] == "horizontal_flip"), c[5] == "1");
        // Batches of two (the last of one): the partner is the other row of the batch.
        let mix = &row["mix"];
        assert!(mix["fn"] == "mixup" || mix["fn"] == "cutmix", "{mix}");
        let partner = mix["partner"].as_u64().expect("partner") as usize;
        assert_eq!(partner, if k == 4 { 4 } else { k ^ 1 }, "row {k}");
        let lam = mix["lam"].as_f64().expect("lam");
        assert!((0.0..=1.0).contains(&lam));
    }
    // The soft labels: a [rows, classes] float32 matrix, each row its label's one-hot times lam
    // and its partner's times 1 - lam (torchvision's MixUp and CutMix).
    let (descr, shape, bytes) = read_npy(&dir.join("out.soft_labels.npy"));
    assert_eq!(
        (descr.as_str(), shape.as_slice()),
        ("<f4", &[5usize, 2][..])
    );
    let soft: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let labels: Vec<usize> = std::fs::read_to_string(dir.join("out.labels.txt"))
        .expect("labels")
        .lines()
        .map(|l| l.parse().expect("label"))
        .collect();
    for (k, row) in rows.iter().enumerate() {
        let lam = row["mix"]["lam"].as_f64().expect("lam") as f32;
        let partner = row["mix"]["partner"].as_u64().expect("partner") as usize;
        let mut want = [0f32; 2];
        want[labels[k]] += lam;
        want[labels[partner]] += 1.0 - lam;
        for class in 0..2 {
            assert!(
                (soft[k * 2 + class] - want[class]).abs() < 1e-6,
                "row {k}: {:?} against {want:?}",
                &soft[k * 2..k * 2 + 2]
            );
        }
    }
}

/// `gpufeed run s3://...` against a real S3 server (SeaweedFS, see `crates/s3-server`), with
/// the credentials in the environment as the AWS command line takes them: the same saved
/// bytes, ids and labels as the shards on disk, over two epochs; requests, bytes, MB/s and the
/// cache's hit rate in the summary; with `--cache-dir`, the shards read to index them kept and
/// read back by the epochs; two runs sharing one cache folder at once; a wrong secret ends the
/// run at once with a message that says so.
#[test]
fn shards_in_s3_run_as_on_disk() {
    let Some(server) = s3_server::S3Server::for_test("shards_in_s3_run_as_on_disk") else {
        return;
    };
    let dir = temp_dir("s3");
    let members = dir.join("m");
    let shards = dir.join("shards");
    std::fs::create_dir_all(&members).expect("mkdir");
    std::fs::create_dir_all(&shards).expect("mkdir");
    let photos = [
        "rocket.jpg",
        "coffee.png",
        "chelsea.png",
        "camera.png",
        "retina.jpg",
    ];
    let mut names = Vec::new();
    for (i, photo) in photos.iter().enumerate() {
        let ext = photo.rsplit_once('.').map(|(_, e)| e).unwrap_or("jpg");
        std::fs::copy(
            repo_path(&format!("assets/{photo}")),
            members.join(format!("k{i}.{ext}")),
        )
        .expect("copy");
        std::fs::write(members.join(format!("k{i}.cls")), format!("{}", 7 - i)).expect("cls");
        names.push(format!("k{i}.{ext}"));
        names.push(format!("k{i}.cls"));
    }
    for (k, part) in names.chunks(6).enumerate() {
        let status = Command::new("tar")
            .arg("-cf")
            .arg(shards.join(format!("s-{k}.tar")))
            .arg("-C")
            .arg(&members)
            .args(part)
            .status()
            .expect("tar");
        assert!(status.success());
    }
    let mut uploads = Vec::new();
    for entry in std::fs::read_dir(&shards).expect("shards") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        uploads.push((format!("cli/{name}"), std::fs::read(&path).expect("read")));
    }
    server.put_all(uploads).expect("upload");
    let run = |source: &str, save: &str, extra: &[&str], env: &[(String, String)]| {
        let npy = dir.join(save);
        let mut args = vec![
            "run",
            source,
            "--webdataset",
            "--cpu",
            "--json",
            "--batch-size",
            "2",
            "--save",
            npy.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(extra);
        Command::new(binary())
            .args(&args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(repo_root())
            .output()
            .expect("run gpufeed")
    };
    let env = server.env();
    let local = run(shards.to_str().expect("utf-8"), "disk.npy", &[], &env);
    assert!(
        local.status.success(),
        "{}",
        String::from_utf8_lossy(&local.stderr)
    );
    let url = server.url("cli/");
    let remote = run(&url, "s3.npy", &["--epochs", "2"], &env);
    assert!(
        remote.status.success(),
        "{}",
        String::from_utf8_lossy(&remote.stderr)
    );
    let (_, shape, disk_bytes) = read_npy(&dir.join("disk.npy"));
    let (_, s3_shape, s3_bytes) = read_npy(&dir.join("s3.npy"));
    // Two epochs from S3: each the disk's bytes.
    assert_eq!(s3_shape[0], 2 * shape[0]);
    assert!(s3_bytes[..disk_bytes.len()] == disk_bytes[..]);
    assert!(s3_bytes[disk_bytes.len()..] == disk_bytes[..]);
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect("saved");
    let disk_paths =
        read("disk.paths.txt").replace(shards.to_str().expect("utf-8"), "s3://gpufeed/cli");
    assert_eq!(read("s3.paths.txt"), format!("{disk_paths}{disk_paths}"));
    let disk_labels = read("disk.labels.txt");
    assert_eq!(read("s3.labels.txt"), format!("{disk_labels}{disk_labels}"));
    let summary = last_json(&remote);
    let shard_bytes: u64 = std::fs::read_dir(&shards)
        .expect("shards")
        .map(|e| e.expect("entry").metadata().expect("size").len())
        .sum();
    let reads = &summary["epochs"][0]["reads"];
    assert_eq!(reads["objects_fetched"], 2, "{summary}");
    assert_eq!(reads["requests"], 2, "{summary}");
    assert_eq!(reads["bytes"], shard_bytes, "{summary}");
    assert!(reads["mb_per_s"].as_f64().expect("MB/s") > 0.0, "{summary}");
    assert_eq!(reads["cache_hit_rate"], 0.0, "{summary}");
    // The read budget (1 GiB) holds both shards: the second epoch needs no request.
    let reads = &summary["epochs"][1]["reads"];
    assert_eq!(reads["kept_in_memory"], 2, "{summary}");
    assert_eq!(reads["requests"], 0, "{summary}");
    assert_eq!(reads["cache_hit_rate"], 1.0, "{summary}");
    assert_eq!(summary["opened"]["objects_fetched"], 2, "{summary}");

    // With a cache folder: the shards read to index them are kept; the epochs read them there.
    let cache = dir.join("cache");
    let cache_arg = cache.to_str().expect("utf-8");
    let cached = run(
        &url,
        "cached.npy",
        &[
            "--epochs",
            "2",
            "--cache-dir",
            cache_arg,
            "--cache-limit",
            "1G",
        ],
        &env,
    );
    assert!(
        cached.status.success(),
        "{}",
        String::from_utf8_lossy(&cached.stderr)
    );
    let summary = last_json(&cached);
    for epoch in 0..2 {
        let reads = &summary["epochs"][epoch]["reads"];
        assert_eq!(reads["cache_hit_rate"], 1.0, "{summary}");
        assert_eq!(reads["bytes"], 0, "{summary}");
    }
    let (_, _, cached_bytes) = read_npy(&dir.join("cached.npy"));
    assert!(cached_bytes == s3_bytes);

    // Two processes on one cache folder at once: both open from its indexes, read its shards.
    let children: Vec<_> = (0..2)
        .map(|k| {
            let npy = dir.join(format!("twin{k}.npy"));
            Command::new(binary())
                .args([
                    "run",
                    &url,
                    "--webdataset",
                    "--cpu",
                    "--json",
                    "--batch-size",
                    "2",
                ])
                .args([
                    "--cache-dir",
                    cache_arg,
                    "--save",
                    npy.to_str().expect("utf-8"),
                ])
                .envs(env.iter().map(|(k, v)| (k, v)))
                .current_dir(repo_root())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for (k, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary = last_json(&out);
        assert_eq!(summary["opened"]["cache_hit_rate"], 1.0, "{summary}");
        assert_eq!(
            summary["epochs"][0]["reads"]["cache_hit_rate"], 1.0,
            "{summary}"
        );
        let (_, _, bytes) = read_npy(&dir.join(format!("twin{k}.npy")));
        assert!(bytes == disk_bytes);
    }

    // A wrong secret: a non-zero exit within seconds, saying so; nothing saved.
    let mut wrong = env.clone();
    for (key, value) in &mut wrong {
        if key == "AWS_SECRET_ACCESS_KEY" {
            *value = "not-the-secret".into();
        }
    }
    let start = std::time::Instant::now();
    let refused = run(&url, "wrong.npy", &[], &wrong);
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
    assert!(!refused.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stderr),
        stdout(&refused)
    );
    assert!(text.contains("refused the credentials"), "{text}");
    assert!(!dir.join("wrong.npy").exists());
}

/// Runs `gpufeed` with `args` in the background (stdout and stderr piped).
fn spawn(args: &[String], env: &[(String, String)]) -> std::process::Child {
    Command::new(binary())
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(repo_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start gpufeed")
}

/// Sends `signal` to `child` and waits: its output, and the time from the signal to its exit.
fn signal_and_wait(child: std::process::Child, signal: &str) -> (Output, std::time::Duration) {
    let sent = std::time::Instant::now();
    let kill = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let o = child.wait_with_output().expect("wait");
    (o, sent.elapsed())
}

/// SIGTERM ends a run as Ctrl-C does, with 143: wherever it waits. While a listing waits on a
/// server that never answers, and while batches wait on one (a list of 100,000 URLs, opened
/// without a request), the run ends within moments of the signal with the summary so far.
#[test]
fn sigterm_and_ctrl_c_end_every_wait_within_moments() {
    let Some(server) =
        s3_server::S3Server::for_test("sigterm_and_ctrl_c_end_every_wait_within_moments")
    else {
        return;
    };
    let proxy = server.fault_proxy().expect("proxy");
    proxy.set(s3_server::faults::Fault::Silent);
    let mut env = server.env();
    env[0].1 = proxy.endpoint();
    let urls = format!("{}/x{{0..99999}}.jpg", proxy.endpoint());
    for (source, signal, status) in [
        (server.url("listing/"), "TERM", 143),
        (server.url("listing/"), "INT", 130),
        (urls.clone(), "TERM", 143),
        (urls, "INT", 130),
    ] {
        let args: Vec<String> = ["run", &source, "--cpu", "--json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let child = spawn(&args, &env);
        // Under way: a connection to the server is open.
        let started = std::time::Instant::now();
        while proxy
            .counts()
            .open
            .load(std::sync::atomic::Ordering::SeqCst)
            == 0
        {
            assert!(started.elapsed().as_secs() < 30, "{source}: no request");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (o, took) = signal_and_wait(child, signal);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(status), "{source} {signal}: {stderr}");
        assert!(
            took < std::time::Duration::from_secs(1),
            "{source}: ended {took:?} after SIG{signal}"
        );
        let summary = last_json(&o);
        assert_eq!(summary["interrupted"], true, "{summary}");
        eprintln!("{source} SIG{signal}: ended {took:?} after the signal");
    }
}

/// Two runs saving to one name at once: the second refuses at its start (with or without
/// `--overwrite`), the first's set is whole; the files a killed run left are removed by the next
/// run; `--state` naming a file of the set is refused before anything runs.
#[test]
fn two_runs_saving_to_one_name_never_mix_and_killed_runs_leave_nothing() {
    let dir = slow_folder("save-set", 120);
    let images = dir.join("images");
    let npy = dir.join("out.npy");
    let args = |more: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "run",
            images.to_str().expect("utf-8"),
            "--cpu",
            "--threads",
            "1",
            "--batch-size",
            "4",
            "--save",
            npy.to_str().expect("utf-8"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(more.iter().map(|s| s.to_string()));
        a
    };
    let partials = || -> Vec<String> {
        std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".partial-") || n.contains(".commit-"))
            .collect()
    };
    let first = spawn(&args(&["--max-batches", "20"]), &[]);
    let started = std::time::Instant::now();
    while partials().is_empty() {
        assert!(
            started.elapsed().as_secs() < 60,
            "the first run did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for more in [&[][..], &["--overwrite"][..]] {
        let second = gpufeed(&args(more).iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(second.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&second.stderr);
        assert!(stderr.contains("another gpufeed run (process"), "{stderr}");
    }
    let o = first.wait_with_output().expect("wait");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, shape, _) = read_npy(&npy);
    let paths = std::fs::read_to_string(dir.join("out.paths.txt")).expect("paths");
    assert_eq!(paths.lines().count(), shape[0]);
    assert!(partials().is_empty(), "{:?}", partials());
    // Killed: its temporary files stay, and the next run removes them.
    std::fs::remove_file(&npy).expect("remove");
    std::fs::remove_file(dir.join("out.paths.txt")).expect("remove");
    let mut killed = spawn(&args(&[]), &[]);
    let started = std::time::Instant::now();
    while partials().is_empty() {
        assert!(started.elapsed().as_secs() < 60, "the run did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    killed.kill().expect("SIGKILL");
    killed.wait().expect("wait");
    assert!(
        !partials().is_empty(),
        "a killed run leaves its temporary files"
    );
    let next = gpufeed(
        &args(&["--max-batches", "1"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(
        next.status.success(),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    assert!(partials().is_empty(), "{:?}", partials());
    assert_eq!(read_npy(&npy).1[0], 4);
    // --state naming a file of the set: refused before anything runs, nothing written.
    for state in ["out.npy", "out.paths.txt", "out.labels.txt"] {
        let state = dir.join(state);
        let o = gpufeed(
            &args(&[
                "--overwrite",
                "--state",
                state.to_str().expect("utf-8"),
                "--json",
            ])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        );
        assert_eq!(o.status.code(), Some(2));
        let error = last_json(&o)["error"].as_str().expect("error").to_string();
        assert!(error.contains("is a file --save"), "{error}");
    }
    assert_eq!(read_npy(&npy).1[0], 4, "untouched");
}

/// Messages and flags: byte counts with units for `--decode-memory` (as the docs write them),
/// `--shuffle` alone (with `--seed`'s seed), argument mistakes under `--json` as JSON with
/// status 2, `--on-error fail` with its error and no summary, `gpufeed` alone outside the
/// repository saying what to do, a resume at or past `--epochs` refused, and a resume with
/// other augmentations refused naming them.
#[test]
fn flags_and_messages_say_what_happens() {
    for memory in ["64M", "100MB", "1G", "2GiB", "67108864"] {
        let o = gpufeed(&["run", "assets", "--cpu", "--decode-memory", memory]);
        assert!(
            o.status.success(),
            "{memory}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let dir = temp_dir("flags");
    let save = |name: &str, more: &[&str]| -> Vec<u8> {
        let npy = dir.join(name);
        let mut args = vec!["run", "assets", "--cpu", "--crop", "16", "--resize", "16"];
        args.extend_from_slice(more);
        args.extend(["--save", npy.to_str().expect("utf-8")]);
        let o = gpufeed(&args);
        assert!(
            o.status.success(),
            "{more:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::read(dir.join(name.replace(".npy", ".paths.txt"))).expect("paths")
    };
    let bare = save("bare.npy", &["--seed", "3", "--shuffle"]);
    assert_eq!(bare, save("given.npy", &["--shuffle", "3"]));
    assert_ne!(bare, save("plain.npy", &[]));
    // --shuffle alone before DIR: DIR is not its value.
    let o = gpufeed(&["run", "--cpu", "--shuffle", "assets", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for mistake in [&["--batch-size", "x"][..], &["--no-such-flag"][..]] {
        let mut args = vec!["run", "assets", "--cpu", "--json"];
        args.extend_from_slice(mistake);
        let o = gpufeed(&args);
        assert_eq!(o.status.code(), Some(2), "{mistake:?}");
        let error = last_json(&o)["error"].as_str().expect("error").to_string();
        assert!(!error.is_empty());
    }
    let o = gpufeed(&["run", "assets", "--cpu", "--json", "--hflip", "2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(last_json(&o)["error"]
        .as_str()
        .expect("error")
        .contains("--hflip"));
    // --on-error fail: the error names the image; no summary before it.
    let bad = dir.join("bad");
    std::fs::create_dir(&bad).expect("dir");
    std::fs::copy(repo_path("assets/rocket.jpg"), bad.join("a.jpg")).expect("copy");
    std::fs::write(bad.join("b.jpg"), b"not a jpeg").expect("write");
    let o = gpufeed(&[
        "run",
        bad.to_str().expect("utf-8"),
        "--cpu",
        "--on-error",
        "fail",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stdout(&o), "", "no summary");
    assert!(String::from_utf8_lossy(&o.stderr).contains("b.jpg"));
    // `gpufeed` alone outside the repository.
    let o = Command::new(binary())
        .current_dir(dir.path())
        .output()
        .expect("run gpufeed");
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("gpufeed run DIR"), "{stderr}");
    // A resume at the end of the run, or far past it; one with other augmentations.
    let images = dir.join("images");
    common::generated_image_folder(&images, 6, 0);
    let state = dir.join("state.json");
    let state = state.to_str().expect("utf-8");
    let trained = |more: &[&str]| {
        let mut args = vec![
            "run",
            images.to_str().expect("utf-8"),
            "--image-folder",
            "--cpu",
            "--train",
            "--crop",
            "24",
            "--batch-size",
            "4",
            "--json",
            "--augment",
            "trivial-augment-wide",
        ];
        args.extend_from_slice(more);
        gpufeed(&args)
    };
    // A temporary state file a killed run left (its process gone): removed by the next run.
    let stale = dir.join("state.json.partial-999999999");
    std::fs::write(&stale, "{").expect("stale");
    let o = trained(&["--state", state, "--mixup", "0.8", "--epochs", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!stale.exists(), "the stale state file is removed");
    // At the run's end: nothing left, and nothing run.
    let o = trained(&["--resume", state, "--mixup", "0.8", "--epochs", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(last_json(&o)["images"], 0);
    let o = trained(&["--resume", state, "--mixup", "0.8", "--epochs", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let error = last_json(&o)["error"].as_str().expect("error").to_string();
    assert!(error.contains("past the end of this run"), "{error}");
    let o = trained(&["--resume", state, "--epochs", "3"]);
    assert!(!o.status.success());
    let error = last_json(&o)["error"].as_str().expect("error").to_string();
    assert!(error.contains("mixup is none here but 0.8"), "{error}");
    let text = std::fs::read_to_string(state).expect("state");
    let edited = text.replacen("\"epoch\": 2", "\"epoch\": 1000000000", 1);
    assert_ne!(edited, text);
    std::fs::write(state, edited).expect("edit");
    let o = trained(&["--resume", state, "--mixup", "0.8", "--epochs", "3"]);
    assert_eq!(o.status.code(), Some(2));
    let error = last_json(&o)["error"].as_str().expect("error").to_string();
    assert!(error.contains("epoch 1000000000"), "{error}");
}

/// The values of an `i8` or `i4` `.npy` written by `--save`, with its shape.
fn read_ints(path: &Path) -> (Vec<usize>, Vec<i64>) {
    let (descr, shape, data) = read_npy(path);
    let values = match descr.as_str() {
        "<i8" => data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect(),
        "<i4" => data
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_le_bytes(b.try_into().expect("4 bytes"))))
            .collect(),
        other => panic!("{}: {other} is not an integer type", path.display()),
    };
    (shape, values)
}

/// `gpufeed run assets --cpu --json --save DIR/out.npy` with `more`: the summary and the
/// `.npy`'s path.
fn patch_run(dir: &TempDir, more: &[&str]) -> (serde_json::Value, PathBuf) {
    let npy = dir.join("out.npy");
    let mut args = vec![
        "run",
        "assets",
        "--cpu",
        "--json",
        "--save",
        npy.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(more);
    let o = gpufeed(&args);
    assert!(
        o.status.success(),
        "{}\n{}",
        stdout(&o),
        String::from_utf8_lossy(&o.stderr)
    );
    (last_json(&o), npy)
}

/// `--patches qwen2-vl --max-pixels N`: the summary counts images and tokens, and `--save`
/// writes the packed tokens, `image_grid_thw` and `cu_seqlens` as NumPy reads them, the tokens
/// those the library gives for the same options.
#[test]
fn qwen2_vl_patches_save_tokens_grids_and_offsets() {
    let dir = temp_dir("patches-qwen");
    let more = [
        "--patches",
        "qwen2-vl",
        "--max-pixels",
        "200704",
        "--min-pixels",
        "3136",
        "--dtype",
        "f32",
        "--batch-size",
        "3",
    ];
    let (summary, npy) = patch_run(&dir, &more);
    assert_eq!(summary["images"], 7);
    assert_eq!(summary["patches"]["preset"], "qwen2-vl");
    assert_eq!(summary["patches"]["patch_dim"], 1176);
    assert_eq!(summary["patches"]["max_pixels"], 200704);
    let tokens = summary["tokens"].as_u64().expect("tokens") as usize;
    assert_eq!(summary["token_rows"].as_u64(), Some(tokens as u64));
    assert_eq!(
        summary["f32_bytes"].as_u64(),
        Some(tokens as u64 * 1176 * 4)
    );
    // Uploaded as u8 on a GPU: the pixels once, not the two frames of a temporal patch.
    assert_eq!(
        summary["u8_bytes"].as_u64(),
        Some(tokens as u64 * 14 * 14 * 3)
    );
    let (descr, shape, data) = read_npy(&npy);
    assert_eq!((descr.as_str(), shape), ("<f4", vec![tokens, 1176]));
    let (grid_shape, grids) = read_ints(&dir.join("out.grids.npy"));
    assert_eq!(grid_shape, vec![7, 3]);
    let (offset_shape, offsets) = read_ints(&dir.join("out.cu_seqlens.npy"));
    assert_eq!(offset_shape, vec![8]);
    assert_eq!(offsets[0], 0);
    for (image, grid) in grids.chunks(3).enumerate() {
        let (t, h, w) = (grid[0], grid[1], grid[2]);
        assert_eq!(t, 1);
        assert!(h % 2 == 0 && w % 2 == 0, "merged 2 x 2: {grid:?}");
        assert!(
            h * w * 14 * 14 <= 200704 && h * w * 14 * 14 >= 3136,
            "{grid:?}"
        );
        assert_eq!(offsets[image + 1] - offsets[image], h * w, "image {image}");
    }
    assert_eq!(offsets[7] as usize, tokens);
    for absent in [".mask.npy", ".coordinates.npy", ".spatial_shapes.npy"] {
        assert!(!dir.join(format!("out{absent}")).exists(), "{absent}");
    }
    let paths = std::fs::read_to_string(dir.join("out.paths.txt")).expect("paths");
    assert_eq!(paths.lines().count(), 7);
    let summary_files: Vec<&str> = summary["saved"]
        .as_array()
        .expect("saved")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(summary_files.iter().any(|f| f.ends_with("out.grids.npy")));
    // The library's batches for the same options, row for row.
    let mut pipeline = gpufeed::Pipeline::builder()
        .source(gpufeed::Source::directory(repo_path("assets")).expect("assets"))
        .device(gpufeed::Device::Cpu)
        .patches(
            gpufeed::patches::Patches::qwen2_vl()
                .max_pixels(200704)
                .min_pixels(3136),
        )
        .dtype(gpufeed::DType::F32)
        .batch_size(3)
        .build()
        .expect("build");
    let mut library = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        library.extend(batch.images().to_host().expect("host").to_le_bytes());
    }
    assert!(library == data, "the saved tokens are the library's");
}

/// `--patches siglip2-naflex --max-patches 64`: padded rows with the mask, spatial shapes and
/// coordinates; each image's tokens are the unmasked rows of its 64.
#[test]
fn siglip2_patches_save_padded_rows_with_mask_and_shapes() {
    let dir = temp_dir("patches-siglip");
    let more = ["--patches", "siglip2-naflex", "--max-patches", "64"];
    let (summary, npy) = patch_run(&dir, &more);
    assert_eq!(summary["images"], 7);
    assert_eq!(summary["token_rows"], 7 * 64);
    let (descr, shape, _) = read_npy(&npy);
    assert_eq!((descr.as_str(), shape), ("<f2", vec![7 * 64, 768]));
    let (mask_shape, mask) = read_ints(&dir.join("out.mask.npy"));
    assert_eq!(mask_shape, vec![7 * 64]);
    let (_, shapes) = read_ints(&dir.join("out.spatial_shapes.npy"));
    let (coordinate_shape, coordinates) = read_ints(&dir.join("out.coordinates.npy"));
    assert_eq!(coordinate_shape, vec![7 * 64, 2]);
    let (_, offsets) = read_ints(&dir.join("out.cu_seqlens.npy"));
    assert_eq!(offsets, (0..=7).map(|i| i * 64).collect::<Vec<i64>>());
    let mut tokens = 0;
    for (image, hw) in shapes.chunks(2).enumerate() {
        let n = (hw[0] * hw[1]) as usize;
        assert!((1..=64).contains(&n), "{hw:?}");
        let rows = &mask[image * 64..(image + 1) * 64];
        assert!(rows[..n].iter().all(|&m| m == 1) && rows[n..].iter().all(|&m| m == 0));
        // Row-major patches: the last token is the grid's last patch.
        let last = (image * 64 + n - 1) * 2;
        assert_eq!(coordinates[last..last + 2], [hw[0] - 1, hw[1] - 1]);
        tokens += n;
    }
    assert_eq!(summary["tokens"].as_u64(), Some(tokens as u64));
}

/// `--patches timm-naflex`: batches of several sequence lengths, each image's rows its batch's
/// length, drawn from the seed: the same files twice.
#[test]
fn timm_patches_save_batches_of_several_lengths() {
    let more = [
        "--patches",
        "timm-naflex",
        "--seq-lens",
        "64,144",
        "--tokens-per-batch",
        "288",
        "--seed",
        "5",
        "--hflip",
        "1",
    ];
    let first = temp_dir("patches-timm-1");
    let second = temp_dir("patches-timm-2");
    let (summary, npy) = patch_run(&first, &more);
    let (again, npy_again) = patch_run(&second, &more);
    assert_eq!(summary["images"], 7);
    assert_eq!(summary["patches"]["seq_lens"], serde_json::json!([64, 144]));
    let rows = summary["token_rows"].as_u64().expect("rows") as usize;
    let (_, offsets) = read_ints(&first.join("out.cu_seqlens.npy"));
    let lengths: Vec<i64> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(lengths.iter().all(|&l| l == 64 || l == 144), "{lengths:?}");
    assert_eq!(*offsets.last().expect("offsets") as usize, rows);
    let (mask_shape, mask) = read_ints(&first.join("out.mask.npy"));
    assert_eq!(mask_shape, vec![rows]);
    assert_eq!(
        mask.iter().sum::<i64>() as u64,
        summary["tokens"].as_u64().expect("tokens")
    );
    let (_, shape, data) = read_npy(&npy);
    assert_eq!(shape, vec![rows, 768]);
    assert_eq!(again["tokens"], summary["tokens"]);
    assert!(
        read_npy(&npy_again).2 == data,
        "the same seed, the same tokens"
    );
}

/// Mistakes in the patch flags name the flag and exit 2; a bad image is listed by its path.
#[test]
fn patch_flags_name_their_mistakes_and_bad_images_their_files() {
    let cases: [(&[&str], &str); 5] = [
        (&["--min-pixels", "100"], "give --patches"),
        (
            &["--patches", "qwen2-vl", "--max-patches", "9"],
            "--max-patches",
        ),
        (
            &["--patches", "qwen2-vl", "--max-pixels", "100"],
            "--max-pixels",
        ),
        (&["--patches", "siglip2-naflex", "--crop", "300"], "--crop"),
        (&["--patches", "clip"], "qwen2-vl-torchvision"),
    ];
    for (more, expected) in cases {
        let mut args = vec!["run", "assets", "--cpu"];
        args.extend_from_slice(more);
        let o = gpufeed(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{more:?}: {stderr}");
        assert!(stderr.contains(expected), "{more:?}: {stderr}");
    }
    let dir = temp_dir("patches-bad");
    std::fs::copy(repo_path("assets/chelsea.png"), dir.join("chelsea.png")).expect("copy");
    std::fs::write(dir.join("broken.jpg"), b"\xff\xd8\xff\xe0 not a jpeg").expect("write");
    let panorama = image::RgbImage::from_fn(10050, 50, |x, _| image::Rgb([x as u8, 7, 9]));
    panorama.save(dir.join("panorama.png")).expect("png");
    let o = gpufeed(&[
        "run",
        dir.path().to_str().expect("utf-8"),
        "--cpu",
        "--json",
        "--patches",
        "qwen2-vl",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = last_json(&o);
    assert_eq!(summary["images"], 1);
    let errors = summary["errors"].as_array().expect("errors");
    for name in ["broken.jpg", "panorama.png"] {
        assert!(
            errors
                .iter()
                .any(|e| e["path"].as_str().is_some_and(|p| p.ends_with(name))),
            "{name}: {errors:?}"
        );
    }
}

/// `--eval-preset` gives the named transform's output size and filter.
#[test]
fn eval_presets_by_name() {
    let o = gpufeed(&[
        "run",
        "assets",
        "--cpu",
        "--json",
        "--eval-preset",
        "siglip-384",
        "--dtype",
        "f32",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(last_json(&o)["f32_bytes"], 7 * 3 * 384 * 384 * 4);
    assert_eq!(last_json(&o)["u8_bytes"], 7 * 3 * 384 * 384);
    let o = gpufeed(&[
        "run",
        "assets",
        "--cpu",
        "--eval-preset",
        "clip",
        "--crop",
        "9",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

/// On a CUDA device (the CPU threads decoding, so the pixels are libjpeg-turbo's), `--save`
/// writes the same tokens and side tensors as on the CPU device, for a packed and a padded
/// preset: the kernel's tokens and the side tensors brought back from the GPU.
#[test]
fn patch_saves_on_a_gpu_equal_the_cpu_device() {
    if !common::gpu_present("patch_saves_on_a_gpu_equal_the_cpu_device") {
        return;
    }
    let presets: [&[&str]; 2] = [
        &["--patches", "qwen2-vl", "--max-pixels", "200704"],
        &["--patches", "siglip2-naflex", "--max-patches", "64"],
    ];
    for preset in presets {
        let cpu = temp_dir("patches-cpu");
        let gpu = temp_dir("patches-gpu");
        let mut more = vec!["--dtype", "f32", "--batch-size", "3", "--decode", "cpu"];
        more.extend_from_slice(preset);
        let (cpu_summary, cpu_npy) = patch_run(&cpu, &more);
        let npy = gpu.join("out.npy");
        let mut args = vec![
            "run",
            "assets",
            "--device",
            "0",
            "--json",
            "--save",
            npy.to_str().expect("utf-8 path"),
        ];
        args.extend_from_slice(&more);
        let o = gpufeed(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let gpu_summary = last_json(&o);
        assert_eq!(gpu_summary["tokens"], cpu_summary["tokens"], "{preset:?}");
        assert!(
            read_npy(&npy).2 == read_npy(&cpu_npy).2,
            "{preset:?}: tokens"
        );
        for side in [
            ".grids.npy",
            ".cu_seqlens.npy",
            ".mask.npy",
            ".spatial_shapes.npy",
        ] {
            let name = format!("out{side}");
            if cpu.join(&name).exists() {
                assert_eq!(
                    read_npy(&gpu.join(&name)),
                    read_npy(&cpu.join(&name)),
                    "{preset:?}: {side}"
                );
            }
        }
    }
}

/// A timm-naflex run stopped after 3 batches (`--max-batches`, `--state`) and resumed
/// (`--resume`) saves, between its two parts, the rows of the run that went through: tokens,
/// grids and offsets.
#[test]
fn patch_runs_resume_row_for_row() {
    let more = [
        "--patches",
        "timm-naflex",
        "--seq-lens",
        "64,144",
        "--tokens-per-batch",
        "288",
        "--seed",
        "9",
        "--dtype",
        "f32",
    ];
    let whole = temp_dir("patches-whole");
    patch_run(&whole, &more);
    let first = temp_dir("patches-first");
    let second = temp_dir("patches-second");
    let state = first.join("state.json");
    let state = state.to_str().expect("utf-8 path");
    let mut stop = more.to_vec();
    stop.extend_from_slice(&["--max-batches", "3", "--state", state]);
    let (stopped, _) = patch_run(&first, &stop);
    assert_eq!(stopped["batches"], 3);
    let mut resume = more.to_vec();
    resume.extend_from_slice(&["--resume", state]);
    patch_run(&second, &resume);
    let saved = |dir: &TempDir, suffix: &str| read_npy(&dir.join(format!("out{suffix}"))).2;
    for suffix in [".npy", ".grids.npy", ".mask.npy", ".coordinates.npy"] {
        let mut parts = saved(&first, suffix);
        parts.extend(saved(&second, suffix));
        assert!(parts == saved(&whole, suffix), "{suffix}");
    }
    let (_, a) = read_ints(&first.join("out.cu_seqlens.npy"));
    let (_, b) = read_ints(&second.join("out.cu_seqlens.npy"));
    let (_, all) = read_ints(&whole.join("out.cu_seqlens.npy"));
    let rows_before = *a.last().expect("offsets");
    let joined: Vec<i64> = a
        .iter()
        .copied()
        .chain(b.iter().skip(1).map(|r| r + rows_before))
        .collect();
    assert_eq!(joined, all);
}

/// Patch runs over an ImageFolder split between two ranks: every image once, each rank's
/// labels, class names and grids beside its tokens.
#[test]
fn patch_runs_over_labelled_shards() {
    let dir = temp_dir("patches-folder");
    let photos = [
        "astronaut.png",
        "camera.png",
        "chelsea.png",
        "coffee.png",
        "rocket.jpg",
    ];
    for (i, photo) in photos.iter().enumerate() {
        let class = dir.join(["cats", "dogs"][i % 2]);
        std::fs::create_dir_all(&class).expect("mkdir");
        std::fs::copy(repo_path(&format!("assets/{photo}")), class.join(photo)).expect("copy");
    }
    let mut images = 0;
    let mut paths = Vec::new();
    for rank in ["0/2", "1/2"] {
        let out = temp_dir("patches-rank");
        let npy = out.join("out.npy");
        let o = gpufeed(&[
            "run",
            dir.path().to_str().expect("utf-8"),
            "--image-folder",
            "--cpu",
            "--json",
            "--patches",
            "qwen2-vl",
            "--max-pixels",
            "50176",
            "--shard",
            rank,
            "--shard-balance",
            "uneven",
            "--save",
            npy.to_str().expect("utf-8"),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let n = last_json(&o)["images"].as_u64().expect("images") as usize;
        images += n;
        let labels = std::fs::read_to_string(out.join("out.labels.txt")).expect("labels");
        assert_eq!(labels.lines().count(), n);
        assert!(labels.lines().all(|l| l == "0" || l == "1"), "{labels}");
        let classes = std::fs::read_to_string(out.join("out.classes.txt")).expect("classes");
        assert_eq!(classes, "cats\ndogs\n");
        assert_eq!(read_ints(&out.join("out.grids.npy")).0, vec![n, 3]);
        let saved = std::fs::read_to_string(out.join("out.paths.txt")).expect("paths");
        paths.extend(saved.lines().map(str::to_string));
    }
    assert_eq!(images, photos.len());
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), photos.len());
}

/// `--packing padded` pads Qwen2-VL's images to each batch's longest, with a mask, and holds
/// the packed run's tokens in its unmasked rows; `--packing` needs `--patches`.
#[test]
fn packing_padded_holds_the_packed_tokens_behind_a_mask() {
    let common = [
        "--patches",
        "qwen2-vl",
        "--max-pixels",
        "50176",
        "--dtype",
        "f32",
    ];
    let packed = temp_dir("patches-packed");
    let padded = temp_dir("patches-padded");
    let (summary, packed_npy) = patch_run(&packed, &common);
    let mut more = common.to_vec();
    more.extend_from_slice(&["--packing", "padded"]);
    let (padded_summary, padded_npy) = patch_run(&padded, &more);
    assert_eq!(padded_summary["patches"]["packed"], false);
    assert_eq!(padded_summary["tokens"], summary["tokens"]);
    let (_, mask) = read_ints(&padded.join("out.mask.npy"));
    let packed_rows = read_npy(&packed_npy).2;
    let padded_rows = read_npy(&padded_npy).2;
    let row_bytes = 1176 * 4;
    let unmasked: Vec<u8> = mask
        .iter()
        .enumerate()
        .filter(|&(_, &m)| m == 1)
        .flat_map(|(row, _)| padded_rows[row * row_bytes..(row + 1) * row_bytes].to_vec())
        .collect();
    assert!(
        unmasked == packed_rows,
        "the unmasked rows are the packed tokens"
    );
    assert!(
        mask.len() > unmasked.len() / row_bytes,
        "the photos differ in size: padding"
    );
    let o = gpufeed(&["run", "assets", "--cpu", "--packing", "padded"]);
    assert_eq!(o.status.code(), Some(2));
    // Pillow 12.1's pass order is the patch output's own; the photos' sizes do not change.
    let older = temp_dir("patches-pillow");
    let mut more = common.to_vec();
    more.extend_from_slice(&["--pillow-version", "12.1"]);
    let (older_summary, _) = patch_run(&older, &more);
    assert_eq!(older_summary["tokens"], summary["tokens"]);
}

/// `--views FILE.json` (or the JSON itself): a recipe of its own, its groups' views counted and
/// saved, each equal to the library's views of the same spec; a misspelt key is refused, named.
#[test]
fn views_of_a_json_spec_are_counted_saved_and_equal_to_the_librarys() {
    let dir = temp_dir("views-spec");
    let spec = r#"[{"size": 80, "count": 2, "interpolation": "lanczos", "flip": 0.5,
                   "color_jitter": {"p": 0.8, "brightness": 0.4, "hue": 0.1}},
                  {"size": 40, "scale": [0.05, 0.3], "blur": {"p": 0.5, "kernel_size": 5},
                   "solarize": 0.5}]"#;
    let file = dir.join("views.json");
    std::fs::write(&file, spec).expect("spec");
    let npy = dir.join("out.npy");
    let o = gpufeed(&[
        "run",
        "assets",
        "--views",
        file.to_str().expect("utf-8 path"),
        "--seed",
        "3",
        "--json",
        "--save",
        npy.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = last_json(&o);
    assert_eq!(summary["views"], 21, "{summary}");
    assert_eq!(summary["views_per_image"], 3, "{summary}");
    // Timed as `gpufeed run`'s summary: the epochs apart from the pipeline's build.
    let epochs = summary["epochs"].as_array().expect("epochs");
    assert_eq!(epochs.len(), 1, "{summary}");
    assert_eq!(epochs[0]["images"], 7, "{summary}");
    let seconds = summary["seconds"].as_f64().expect("seconds");
    assert_eq!(epochs[0]["seconds"].as_f64(), Some(seconds), "{summary}");
    let setup = summary["setup_seconds"].as_f64().expect("setup_seconds");
    let first = summary["first_batch_seconds"]
        .as_f64()
        .expect("first_batch_seconds");
    assert!(first > 0.0 && first <= setup + seconds, "{summary}");
    let decoded = &summary["decoded_by"];
    assert_eq!(
        decoded["cpu"].as_u64().expect("cpu") + decoded["gpu"].as_u64().expect("gpu"),
        7,
        "{summary}"
    );
    let views = gpufeed::views::Views::from_json(spec)
        .expect("spec")
        .seed(3);
    let bytes = std::fs::read(repo_path("assets/rocket.jpg")).expect("rocket");
    let lines = std::fs::read_to_string(dir.join("out.views.jsonl")).expect("jsonl");
    let line: serde_json::Value = lines
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .find(|l: &serde_json::Value| {
            l["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("rocket.jpg"))
        })
        .expect("rocket's first view");
    let index = line["index"].as_u64().expect("index") as usize;
    let want =
        gpufeed::cpu::render_views(&bytes, &Default::default(), &views, index, 0).expect("views");
    for (k, view) in want.iter().enumerate() {
        let saved = std::fs::read(dir.join(format!("out.view{k}.npy"))).expect("view");
        let bytes = view.pixels.len();
        // The seven images' rows after the header.
        let at = saved.len() - 7 * bytes;
        // Rows in the order of the run: rocket.jpg's row is its line's place among the images.
        let place = lines
            .lines()
            .filter(|l| l.contains(&format!("\"view\": {k},")))
            .position(|l| l.contains("rocket.jpg"))
            .expect("rocket's row");
        assert_eq!(
            &saved[at + place * bytes..at + (place + 1) * bytes],
            &view.pixels[..]
        );
    }
    // The spec as text, and a misspelt key.
    let o = gpufeed(&["run", "assets", "--views", r#"[{"size": 48}]"#, "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(last_json(&o)["views"], 7);
    let o = gpufeed(&["run", "assets", "--views", r#"[{"size": 48, "colour": 1}]"#]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--views") && err.contains("\"colour\""),
        "{err}"
    );
}

/// A views run lists the files it skipped as `run` does: `skipped` counts them, `errors` names
/// each with its reason, and the other images' views are all there.
#[test]
fn views_runs_list_their_skipped_files_as_runs_do() {
    let dir = temp_dir("views-skipped");
    std::fs::copy(repo_path("assets/rocket.jpg"), dir.join("rocket.jpg")).expect("copy");
    std::fs::write(dir.join("broken.jpg"), b"\xff\xd8 not a JPEG after all").expect("write");
    let o = gpufeed(&[
        "run",
        dir.to_str().expect("utf-8 path"),
        "--views",
        "simclr",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = last_json(&o);
    assert_eq!(summary["images"], 1, "{summary}");
    assert_eq!(summary["views"], 2, "{summary}");
    assert_eq!(summary["skipped"], 1, "{summary}");
    let error = &summary["errors"][0];
    assert!(
        error["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("broken.jpg")),
        "{summary}"
    );
    assert!(
        error["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{summary}"
    );
}

/// `--views dinov2`: ten views of each image, counted in the summary; `--save` writes each view
/// and what it drew, equal to the library's views of the same image; flags that do not apply
/// to views are refused.
#[test]
fn views_are_counted_saved_and_equal_to_the_librarys() {
    let dir = temp_dir("views");
    let npy = dir.join("out.npy");
    let o = gpufeed(&[
        "run",
        "assets",
        "--views",
        "dinov2",
        "--seed",
        "5",
        "--json",
        "--save",
        npy.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = last_json(&o);
    assert_eq!(summary["images"], 7, "{summary}");
    assert_eq!(summary["views"], 70, "{summary}");
    assert_eq!(summary["skipped"], 0, "{summary}");
    assert_eq!(summary["errors"], serde_json::json!([]), "{summary}");
    let lines = std::fs::read_to_string(dir.join("out.views.jsonl")).expect("jsonl");
    let lines: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 70);
    let bytes = std::fs::read(repo_path("assets/rocket.jpg")).expect("rocket");
    let index = lines
        .iter()
        .find(|l| {
            l["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("rocket.jpg"))
        })
        .and_then(|l| l["index"].as_u64())
        .expect("rocket's line") as usize;
    let views = gpufeed::views::Views::dinov2().seed(5);
    let want =
        gpufeed::cpu::render_views(&bytes, &Default::default(), &views, index, 0).expect("views");
    for (k, view) in want.iter().enumerate() {
        let (descr, shape, data) = read_npy(&dir.join(format!("out.view{k}.npy")));
        let size = if k < 2 { 224 } else { 96 };
        assert_eq!((descr.as_str(), shape), ("|u1", vec![7, size, size, 3]));
        let row = size * size * 3;
        assert!(
            data[index * row..(index + 1) * row] == view.pixels[..],
            "view {k}"
        );
        let line = &lines[index * 10 + k];
        assert_eq!(line["view"], k);
        assert_eq!(line["top"], view.draw.crop.top);
        assert_eq!(line["flip"], view.draw.crop.flipped);
    }
    // Another seed, other views.
    let other = gpufeed::cpu::render_views(&bytes, &Default::default(), &views.seed(6), index, 0)
        .expect("views");
    assert_ne!(other[0].pixels, want[0].pixels);
    // Pillow 12.3's rounding: the library's views at that version, and other bytes than 13.0's
    // somewhere among the 70 views.
    let older = temp_dir("views-pillow");
    let older_npy = older.join("out.npy");
    let o = gpufeed(&[
        "run",
        "assets",
        "--views",
        "dinov2",
        "--seed",
        "5",
        "--pillow-version",
        "12.3",
        "--save",
        older_npy.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let at_12_3 = gpufeed::cpu::render_views(
        &bytes,
        &Default::default(),
        &gpufeed::views::Views::dinov2()
            .seed(5)
            .pillow_version(12, 3),
        index,
        0,
    )
    .expect("views");
    let mut differing = 0;
    for (k, view) in at_12_3.iter().enumerate() {
        let (_, _, data) = read_npy(&older.join(format!("out.view{k}.npy")));
        let row = data.len() / 7;
        assert!(
            data[index * row..(index + 1) * row] == view.pixels[..],
            "view {k} at 12.3"
        );
        let (_, _, newer) = read_npy(&dir.join(format!("out.view{k}.npy")));
        differing += usize::from(newer != data);
    }
    assert!(differing > 0, "Pillow 12.3's rounding changed no view");
    for refused in [
        &["--views", "dinov2", "--train"][..],
        &["--views", "dinov2", "--max-batches", "2"],
        &["--views", "dino"],
    ] {
        let mut args = vec!["run", "assets"];
        args.extend_from_slice(refused);
        let o = gpufeed(&args);
        assert_eq!(o.status.code(), Some(2), "{refused:?}");
    }
}

/// `--views` with `--state` and `--resume`: a run stopped after its first epoch and resumed
/// gives the views an uninterrupted run gives, byte for byte.
#[test]
fn views_resume_from_a_saved_state() {
    let run = |dir: &TempDir, args: &[&str]| {
        let npy = dir.join("out.npy");
        let mut all = vec![
            "run",
            "assets",
            "--views",
            "simclr",
            "--cpu",
            "--shuffle",
            "4",
            "--batch-size",
            "3",
            "--json",
            "--save",
        ];
        all.push(npy.to_str().expect("utf-8 path"));
        all.extend_from_slice(args);
        let o = gpufeed(&all);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let summary = last_json(&o);
        let (_, _, view) = read_npy(&dir.join("out.view1.npy"));
        let lines = std::fs::read_to_string(dir.join("out.views.jsonl")).expect("jsonl");
        (summary, view, lines)
    };
    let whole = temp_dir("views-whole");
    let (summary, all, all_lines) = run(&whole, &["--epochs", "2"]);
    assert_eq!(summary["images"], 14, "{summary}");
    assert_eq!(summary["device"], "CPU", "{summary}");
    let first = temp_dir("views-first");
    let state = first.join("state.json");
    let state = state.to_str().expect("utf-8 path");
    let (_, head, head_lines) = run(&first, &["--epochs", "1", "--state", state]);
    let second = temp_dir("views-second");
    let (summary, tail, tail_lines) = run(&second, &["--epochs", "2", "--resume", state]);
    assert_eq!(summary["images"], 7, "{summary}");
    assert!(
        [head, tail].concat() == all,
        "the resumed epoch's views differ"
    );
    assert_eq!(format!("{head_lines}{tail_lines}"), all_lines);
}

/// `--views` with `--shard` and `--shuffle`: each rank's images in the order a pipeline takes,
/// the ranks together covering the source.
#[test]
fn views_follow_the_shuffle_and_the_shard() {
    let indices = |args: &[&str]| -> Vec<u64> {
        let dir = temp_dir("views-shard");
        let npy = dir.join("out.npy");
        let mut all = vec!["run", "assets", "--views", "simclr", "--save"];
        all.push(npy.to_str().expect("utf-8 path"));
        all.extend_from_slice(args);
        let o = gpufeed(&all);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let lines = std::fs::read_to_string(dir.join("out.views.jsonl")).expect("jsonl");
        lines
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON"))
            .filter(|l| l["view"] == 0)
            .map(|l| l["index"].as_u64().expect("index"))
            .collect()
    };
    assert_eq!(indices(&[]), (0..7).collect::<Vec<_>>());
    let shuffled = indices(&["--shuffle", "3"]);
    assert_ne!(shuffled, (0..7).collect::<Vec<_>>());
    let mut sorted = shuffled.clone();
    sorted.sort();
    assert_eq!(sorted, (0..7).collect::<Vec<_>>());
    let (a, b) = (
        indices(&["--shuffle", "3", "--shard", "0/2"]),
        indices(&["--shuffle", "3", "--shard", "1/2"]),
    );
    let mut both: Vec<u64> = a.iter().chain(&b).copied().collect();
    both.sort();
    both.dedup();
    assert_eq!(both, (0..7).collect::<Vec<_>>());
    assert_eq!(a.iter().step_by(1).take(1).next(), shuffled.first());
}

/// Writes `photos` (of assets/) as a Parquet file: a binary `image`, an int64 `label` and a
/// `caption` (with a tab in it), in row groups of 2 rows.
fn write_parquet(path: &Path, photos: &[&str]) {
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use std::sync::Arc;
    let schema = parquet::schema::parser::parse_message_type(
        "message m { required binary image; required int64 label; required binary caption (UTF8); }",
    )
    .expect("schema");
    let file = std::fs::File::create(path).expect("create");
    let props = Arc::new(WriterProperties::builder().build());
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), props).expect("writer");
    for (g, pair) in photos.chunks(2).enumerate() {
        let mut group = writer.next_row_group().expect("group");
        let images: Vec<ByteArray> = pair
            .iter()
            .map(|p| {
                ByteArray::from(std::fs::read(repo_path(&format!("assets/{p}"))).expect("photo"))
            })
            .collect();
        let labels: Vec<i64> = (0..pair.len()).map(|i| (g * 2 + i) as i64 * 10).collect();
        let captions: Vec<ByteArray> = pair
            .iter()
            .map(|p| ByteArray::from(format!("a\t{p}").as_str()))
            .collect();
        let mut column = group.next_column().expect("column").expect("image");
        column
            .typed::<ByteArrayType>()
            .write_batch(&images, None, None)
            .expect("write");
        column.close().expect("close");
        let mut column = group.next_column().expect("column").expect("label");
        column
            .typed::<Int64Type>()
            .write_batch(&labels, None, None)
            .expect("write");
        column.close().expect("close");
        let mut column = group.next_column().expect("column").expect("caption");
        column
            .typed::<ByteArrayType>()
            .write_batch(&captions, None, None)
            .expect("write");
        column.close().expect("close");
        group.close().expect("close group");
    }
    writer.close().expect("close file");
}

/// `--parquet FILE` reads the rows as the same photos given as files; `--save` writes their
/// labels and `--extra-columns`' values beside them; Parquet's flags without it are refused.
#[test]
fn parquet_rows_run_and_save_their_extra_columns() {
    let dir = temp_dir("parquet");
    let photos = ["rocket.jpg", "coffee.png", "chelsea.png"];
    let file = dir.join("train-00000-of-00001.parquet");
    write_parquet(&file, &photos);
    let npy = dir.join("p.npy");
    let o = gpufeed(&[
        "run",
        file.to_str().expect("utf-8"),
        "--parquet",
        "--extra-columns",
        "caption",
        "--cpu",
        "--json",
        "--save",
        npy.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(last_json(&o)["images"], 3);
    let read =
        |suffix: &str| std::fs::read_to_string(dir.join(format!("p{suffix}"))).expect(suffix);
    assert_eq!(read(".labels.txt"), "0\n10\n20\n");
    assert_eq!(
        read(".extra.tsv"),
        "caption\na\\trocket.jpg\na\\tcoffee.png\na\\tchelsea.png\n"
    );
    let file_text = file.to_str().expect("utf-8");
    let expected: String = (0..3).map(|i| format!("{file_text}:{i}\n")).collect();
    assert_eq!(read(".paths.txt"), expected);
    // The same rows as the photos given as files.
    let folder = dir.join("photos");
    std::fs::create_dir_all(&folder).expect("mkdir");
    for (i, photo) in photos.iter().enumerate() {
        std::fs::copy(
            repo_path(&format!("assets/{photo}")),
            folder.join(format!("{i}-{photo}")),
        )
        .expect("copy");
    }
    let reference = dir.join("r.npy");
    let o = gpufeed(&[
        "run",
        folder.to_str().expect("utf-8"),
        "--cpu",
        "--json",
        "--save",
        reference.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        read_npy(&npy) == read_npy(&reference),
        "the same rows as the files"
    );
    let o = gpufeed(&["run", "assets", "--extra-columns", "caption", "--cpu"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("for --parquet"));
}

#[test]
fn targets_reads_webdataset_shards_with_their_json() {
    let dir = temp_dir("cli-targets-wds");
    let root = dir.path();
    std::fs::copy(repo_path("assets/rocket.jpg"), root.join("a.jpg")).expect("copy");
    std::fs::copy(repo_path("assets/retina.jpg"), root.join("b.jpg")).expect("copy");
    let json = r#"{"boxes": [[10, 20, 100, 50]], "labels": [3], "note": "ignored"}"#;
    std::fs::write(root.join("a.json"), json).expect("write");
    std::fs::write(root.join("b.json"), "{not json").expect("write");
    let shard = root.join("s.tar");
    let status = Command::new("tar")
        .arg("-cf")
        .arg(&shard)
        .arg("-C")
        .arg(root)
        .args(["a.jpg", "a.json", "b.jpg", "b.json"])
        .status()
        .expect("tar");
    assert!(status.success());
    let shard = shard.to_string_lossy().into_owned();
    let o = gpufeed(&["targets", &shard, "--webdataset", "detection", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary = last_json(&o);
    assert_eq!(summary["images"], 1, "{summary}");
    assert_eq!(summary["skipped"], 1, "{summary}");
    let skipped = summary["errors"].as_array().expect("errors");
    assert_eq!(skipped.len(), 1, "{summary}");
    assert_eq!(skipped[0]["path"], format!("{shard}:b.jpg"));
    assert!(skipped[0]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("not JSON")));
    let o = gpufeed(&["targets", &shard]);
    assert!(!o.status.success());
}
