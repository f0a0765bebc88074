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
