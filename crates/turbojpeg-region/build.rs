//! Compiles `src/shim.c`, the libjpeg API calls TurboJPEG does not offer (decoding with the
//! faster Huffman decoder of `src/huffman.c`, coefficient reading, JPEG writing with any sampling
//! factors), against the headers of the libjpeg-turbo that
//! `turbojpeg-sys` builds: its include folder comes as `DEP_TURBOJPEG_INCLUDE`.

fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-changed=src/huffman.c");
    println!("cargo:rerun-if-changed=src/huffman.h");
    println!("cargo:rerun-if-env-changed=DEP_TURBOJPEG_INCLUDE");
    let Ok(include) = std::env::var("DEP_TURBOJPEG_INCLUDE") else {
        eprintln!(
            "turbojpeg-sys did not say where libjpeg-turbo's headers are (DEP_TURBOJPEG_INCLUDE)"
        );
        std::process::exit(1);
    };
    let mut build = cc::Build::new();
    build
        .file("src/shim.c")
        .file("src/huffman.c")
        .warnings(true)
        .extra_warnings(true);
    for dir in include.split(',').filter(|d| !d.is_empty()) {
        build.include(dir);
    }
    build.compile("turbojpeg_region_shim");
}
