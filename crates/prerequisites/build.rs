//! Says in one line what to install when the tools that build the bundled libjpeg-turbo are
//! missing, instead of a build-script backtrace further down.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TURBOJPEG_SOURCE");
    println!("cargo:rerun-if-env-changed=PATH");
    // libjpeg-turbo is built from source unless the environment points at an installed one.
    let from_source = std::env::var("TURBOJPEG_SOURCE")
        .map(|s| s.eq_ignore_ascii_case("vendor"))
        .unwrap_or(true);
    if !from_source {
        return;
    }
    let missing: Vec<&str> = ["cmake", "nasm"]
        .into_iter()
        .filter(|tool| {
            Command::new(tool)
                .arg("--version")
                .output()
                .map_or(true, |o| !o.status.success())
        })
        .collect();
    if !missing.is_empty() {
        println!(
            "cargo::error=gpufeed builds libjpeg-turbo from source and needs {}: install with \
             `sudo apt-get install cmake nasm` (Debian/Ubuntu) or `brew install cmake nasm` (macOS)",
            missing.join(" and ")
        );
    }
}
