//! Writes gpufeed's patch sequences of the presets for each image given, as NumPy files, for
//! `tests/patches_reference.py` to compare with transformers' and timm's processors.
//!
//! ```text
//! cargo run --release --example patches_reference -- OUT_DIR IMAGE...
//! ```
//!
//! For image `NAME` and configuration `CONFIG` it writes `NAME.CONFIG.npy` (the `float32` token
//! tensor: `[tokens, patch_dim]` packed, `[len, patch_dim]` padded) and `NAME.CONFIG.json` (the
//! plan, `cu_seqlens`, the mask and patch coordinates) and `NAME.CONFIG.pixels.npy` (the resized
//! `uint8` image, `[height, width, 3]`), or `NAME.CONFIG.json` with the error alone when the
//! image is refused.

use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use gpufeed::cpu::{patch_batch, patch_image, PatchDraw};
use gpufeed::patches::Patches;
use gpufeed::{DType, DecodeOptions, HostData};

/// The configurations compared, by name.
fn configurations() -> Vec<(&'static str, Patches, Option<u32>)> {
    vec![
        ("qwen2-vl", Patches::qwen2_vl(), None),
        (
            "qwen2-vl-small",
            Patches::qwen2_vl()
                .min_pixels(28 * 28 * 4)
                .max_pixels(28 * 28 * 64),
            None,
        ),
        (
            "qwen2-vl-torchvision",
            Patches::qwen2_vl().torchvision(),
            None,
        ),
        ("siglip2", Patches::siglip2_naflex(), None),
        (
            "siglip2-64",
            Patches::siglip2_naflex().max_patches(64),
            None,
        ),
        ("timm-eval", Patches::timm_naflex().seq_lens(&[576]), None),
        ("timm-train", Patches::timm_naflex(), Some(256)),
    ]
}

/// The seed of `timm-train`'s draws; image `i` of the command line is index `i` of epoch 3.
const SEED: u64 = 7;
const EPOCH: u64 = 3;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(
        args.next()
            .ok_or("usage: patches_reference OUT_DIR IMAGE...")?,
    );
    std::fs::create_dir_all(&out)?;
    for (index, path) in args.enumerate() {
        let bytes = std::fs::read(&path)?;
        let name = Path::new(&path)
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("a file name")?;
        for (config, patches, seq_len) in configurations() {
            let draw = seq_len.map(|seq_len| PatchDraw {
                seq_len,
                seed: SEED,
                epoch: EPOCH,
                index,
            });
            let stem = out.join(format!("{name}.{config}"));
            let decode = DecodeOptions::default();
            let made = patch_image(&bytes, name, &decode, &patches, draw).and_then(|image| {
                let batch =
                    patch_batch(std::slice::from_ref(&image), &patches, DType::F32, seq_len)?;
                Ok((image, batch))
            });
            match made {
                Ok((image, batch)) => {
                    let shape = [image.plan.height as usize, image.plan.width as usize, 3];
                    write_npy(
                        &path_with(&stem, "pixels.npy"),
                        "|u1",
                        &shape,
                        &image.pixels,
                    )?;
                    write_batch(&stem, &batch, &patches)?;
                }
                Err(e) => std::fs::write(
                    path_with(&stem, "json"),
                    format!("{{\"error\": {:?}}}", e.to_string()),
                )?,
            }
        }
    }
    Ok(())
}

fn write_batch(
    stem: &Path,
    batch: &gpufeed::cpu::PatchBatch,
    patches: &Patches,
) -> Result<(), Box<dyn Error>> {
    let HostData::F32(tokens) = &batch.tokens else {
        return Err("float32 tokens were asked for".into());
    };
    let bytes: Vec<u8> = tokens.iter().flat_map(|v| v.to_le_bytes()).collect();
    let shape = [batch.layout.rows, batch.patch_dim];
    write_npy(&path_with(stem, "npy"), "<f4", &shape, &bytes)?;
    let plan = batch.plans[0];
    let mut json = String::from("{");
    let _ = write!(
        json,
        "\"width\": {}, \"height\": {}, \"grid\": [{}, {}, {}], \"crop\": [{}, {}, {}, {}], \
         \"flipped\": {}, \"cu_seqlens\": {:?}, \"mask\": {:?}, \"coords\": {:?}",
        plan.width,
        plan.height,
        plan.grid_t,
        plan.grid_h,
        plan.grid_w,
        plan.top,
        plan.left,
        plan.crop_height,
        plan.crop_width,
        plan.flipped,
        batch.cu_seqlens(),
        batch.layout.mask(),
        batch.layout.coordinates(patches.token_order()),
    );
    json.push('}');
    std::fs::write(path_with(stem, "json"), json)?;
    Ok(())
}

/// A NumPy file (format 1.0) of `shape` and element type `descr` holding `data`.
fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) -> std::io::Result<()> {
    let dims: String = shape.iter().map(|d| format!("{d}, ")).collect();
    let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}");
    // Magic, version and length take 10 bytes; the header ends in a newline at a multiple of 64.
    let len = (header.len() + 11).next_multiple_of(64) - 10;
    let header = format!("{header:<width$}\n", width = len - 1);
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend_from_slice(&(header.len() as u16).to_le_bytes());
    npy.extend_from_slice(header.as_bytes());
    npy.extend_from_slice(data);
    std::fs::write(path, npy)
}

fn path_with(stem: &Path, extension: &str) -> PathBuf {
    let mut s = stem.as_os_str().to_owned();
    s.push(".");
    s.push(extension);
    PathBuf::from(s)
}
