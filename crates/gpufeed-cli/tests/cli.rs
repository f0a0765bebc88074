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
