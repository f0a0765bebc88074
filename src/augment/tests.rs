//! The CPU rendition against torchvision v2 itself: golden vectors that
//! `tests/augment/make_vectors.py` wrote with torchvision 0.26 (every call on small random,
//! smooth, flat and real images, with the parameters the policies draw), and the draws against
//! the samplers' definitions over 100,000 images.

use super::policy::{self, Augment, Ranges, Transform};
use super::*;

/// One golden call: the input image's index, the call, and torchvision's output.
struct Golden {
    input: usize,
    line: String,
    op: Op,
    want: Vec<u8>,
}

fn goldens() -> (Vec<(usize, usize, Vec<u8>)>, Vec<Golden>) {
    let text =
        std::fs::read_to_string("tests/augment/vectors.txt").expect("tests/augment/vectors.txt");
    let blob = std::fs::read("tests/augment/vectors.bin").expect("tests/augment/vectors.bin");
    let mut at = 0;
    let mut take = |len: usize| {
        let bytes = blob[at..at + len].to_vec();
        at += len;
        bytes
    };
    let mut inputs: Vec<(usize, usize, Vec<u8>)> = Vec::new();
    let mut cases = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let f = |k: usize| words[k].parse::<f64>().expect("a number");
        let u = |k: usize| words[k].parse::<i64>().expect("an integer");
        if words[0] == "input" {
            let (h, w) = (u(1) as usize, u(2) as usize);
            inputs.push((h, w, take(h * w * 3)));
            continue;
        }
        let input = u(1) as usize;
        let rgb = |k: usize| [u(k) as u8, u(k + 1) as u8, u(k + 2) as u8];
        let op = match words[2] {
            "shear" => Op::Shear {
                x: f(3),
                y: f(4),
                fill: rgb(5),
            },
            "translate" => Op::Translate {
                x: u(3) as i32,
                y: u(4) as i32,
                fill: rgb(5),
            },
            "rotate" => Op::Rotate {
                angle: f(3),
                fill: rgb(4),
            },
            "brightness" => Op::Brightness(f(3)),
            "saturation" => Op::Saturation(f(3)),
            "contrast" => Op::Contrast(f(3)),
            "sharpness" => Op::Sharpness(f(3)),
            "hue" => Op::Hue(f(3)),
            "posterize" => Op::Posterize(u(3) as u8),
            "solarize" => Op::Solarize(f(3)),
            "autocontrast" => Op::AutoContrast,
            "equalize" => Op::Equalize,
            "invert" => Op::Invert,
            "erase" => Op::Erase {
                i: u(3) as u32,
                j: u(4) as u32,
                h: u(5) as u32,
                w: u(6) as u32,
                v: rgb(7),
            },
            other => panic!("unknown call {other}"),
        };
        let (h, w, _) = &inputs[input];
        let want = take(h * w * 3);
        cases.push(Golden {
            input,
            line: line.to_string(),
            op,
            want,
        });
    }
    assert_eq!(at, blob.len(), "every byte of the vectors read");
    (inputs, cases)
}

#[test]
fn every_call_matches_torchvision_v2() {
    let (inputs, cases) = goldens();
    assert!(cases.len() > 300, "{} cases", cases.len());
    let mut failures = Vec::new();
    let mut checked = std::collections::BTreeMap::<&str, (usize, usize)>::new();
    for case in &cases {
        let (h, w, input) = &inputs[case.input];
        let mut got = input.clone();
        apply_ops(&[case.op], &mut got, *h, *w).expect("apply");
        let worst = got
            .iter()
            .zip(&case.want)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap_or(0);
        let differ = got.iter().zip(&case.want).filter(|(a, b)| a != b).count();
        let entry = checked.entry(case.op.function()).or_default();
        entry.0 += 1;
        entry.1 += differ;
        // Every call is exact; torchvision's float arithmetic is reproduced operation by
        // operation, so a single level off anywhere is a mistake.
        if worst > 0 {
            failures.push(format!(
                "{}: {differ} samples differ, by up to {worst}",
                case.line
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} calls differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // Every function was covered.
    for f in [
        "affine",
        "rotate",
        "adjust_brightness",
        "adjust_saturation",
        "adjust_contrast",
        "adjust_sharpness",
        "adjust_hue",
        "posterize",
        "solarize",
        "autocontrast",
        "equalize",
        "invert",
        "erase",
    ] {
        assert!(checked.get(f).is_some_and(|c| c.0 > 0), "{f} not covered");
    }
}
