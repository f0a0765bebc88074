//! The CPU rendition against torchvision v2 itself: golden vectors that
//! `tests/augment/make_vectors.py` wrote with torchvision 0.26 (every call on small random,
//! smooth, flat and real images, with the parameters the policies draw), and the draws against
//! the samplers' definitions over 100,000 images.

use super::policy::{self, Ranges, Transform};
use super::*;

/// One golden call: the input image's index, the call, and torchvision's output.
struct Golden {
    input: usize,
    line: String,
    op: Op,
    want: Vec<u8>,
}

/// The vectors' folder: `tests/augment`, or `GPUFEED_AUGMENT_VECTORS` (vectors written afresh by
/// `make_vectors.py --seed S --out DIR` where torchvision is installed).
/// A golden input: height, width, pixels.
type Input = (usize, usize, Vec<u8>);

fn goldens() -> (Vec<Input>, Vec<Golden>) {
    let dir = std::env::var("GPUFEED_AUGMENT_VECTORS").unwrap_or_else(|_| "tests/augment".into());
    let text = std::fs::read_to_string(format!("{dir}/vectors.txt")).expect("vectors.txt");
    let blob = std::fs::read(format!("{dir}/vectors.bin")).expect("vectors.bin");
    let mut at = 0;
    let mut take = |len: usize| {
        let bytes = blob[at..at + len].to_vec();
        at += len;
        bytes
    };
    let mut inputs: Vec<Input> = Vec::new();
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
    // For tests/augment/kernel_harness.cpp: each call's kernel operations, input and
    // torchvision's output.
    let mut kernel_cases = Vec::new();
    for case in &cases {
        let (h, w, input) = &inputs[case.input];
        let ops: Vec<KernelOp> = case.op.kernel(*w, *h).into_iter().collect();
        for v in [*h as u32, *w as u32, ops.len() as u32] {
            kernel_cases.extend_from_slice(&v.to_le_bytes());
        }
        for op in &ops {
            for v in [op.kind, op.a, op.b, op.c, op.d, op.e] {
                kernel_cases.extend_from_slice(&v.to_le_bytes());
            }
            for v in op.f {
                kernel_cases.extend_from_slice(&v.to_le_bytes());
            }
        }
        kernel_cases.extend_from_slice(input);
        kernel_cases.extend_from_slice(&case.want);
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
    if let Ok(path) = std::env::var("GPUFEED_KERNEL_CASES") {
        std::fs::write(&path, &kernel_cases).expect("writing the kernel cases");
    }
    kernel_source_on_the_cpu(&kernel_cases);
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

/// Pearson's chi-square statistic of `counts` against equal expected counts.
fn chi_square_uniform(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    let expected = total as f64 / counts.len() as f64;
    counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum()
}

/// The chi-square value with `dof` degrees of freedom exceeded with probability about 1e-6
/// (Wilson-Hilferty), so the tests below fail by chance about once in a million runs.
fn chi_square_limit(dof: usize) -> f64 {
    let k = dof as f64;
    let z = 4.753; // the standard normal's 1 - 1e-6 quantile
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// `count` successes of `n` trials with chance `p`, within 5 standard deviations.
fn binomial_ok(count: u64, n: u64, p: f64) -> bool {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    (count as f64 - mean).abs() <= 5.0 * sd + 1.0
}

const DRAWS: usize = 100_000;

/// The transforms and signed magnitudes `policy` draws for `DRAWS` images (224 x 224), checked
/// to be the calls the pipeline's own draws make.
fn draws_of(policy: Augment) -> Vec<Vec<(Transform, f64)>> {
    let augmenter = Augmenter {
        options: AugmentOptions::default().policy(policy),
        seed: 3,
        width: 224,
        height: 224,
    };
    (0..DRAWS)
        .map(|index| {
            let mut draws = crate::random::Draws::for_image(augmenter.seed ^ IMAGE_SALT, 1, index);
            let (mut ops, mut chosen) = (Vec::new(), Vec::new());
            policy::draw_policy(
                policy,
                224,
                224,
                [0; 3],
                &mut draws,
                &mut ops,
                Some(&mut chosen),
            );
            assert_eq!(ops, augmenter.image_ops(index, 1));
            chosen
        })
        .collect()
}

/// The bin of a magnitude's absolute value in `t`'s table, and whether it was negated.
fn bin_of(t: Transform, ranges: Ranges, bins: usize, m: f64) -> Option<(usize, bool)> {
    let (values, _) = policy::magnitudes(t, ranges, bins, 224, 224)?;
    let bin = values
        .iter()
        .position(|&v| f64::from(v) == m.abs())
        .expect("a magnitude of the table");
    Some((bin, m.is_sign_negative() && m != 0.0))
}

fn is_signed(t: Transform, ranges: Ranges, bins: usize) -> bool {
    policy::magnitudes(t, ranges, bins, 224, 224).is_some_and(|(_, signed)| signed)
}

#[test]
fn trivial_augment_wide_draws_torchvisions_distribution() {
    let drawn = draws_of(Augment::TrivialAugmentWide);
    let mut ops = [0u64; 14];
    let mut bins = [0u64; 31];
    let (mut signed, mut negative) = (0u64, 0u64);
    for image in &drawn {
        assert_eq!(image.len(), 1, "one operation an image");
        let (t, m) = image[0];
        ops[policy::WIDE_SPACE
            .iter()
            .position(|&s| s == t)
            .expect("in the space")] += 1;
        if let Some((bin, neg)) = bin_of(t, Ranges::Wide, 31, m) {
            // Posterize's bins repeat their values: its bin cannot be told from its value.
            if t != Transform::Posterize {
                bins[bin] += 1;
            }
            // Bin 0 is magnitude 0, whose sign cannot be seen.
            if is_signed(t, Ranges::Wide, 31) && bin > 0 {
                signed += 1;
                negative += u64::from(neg);
            } else {
                assert!(!neg, "{t:?} keeps its sign");
            }
        }
    }
    // Operation uniform over the 14, bin uniform over the 31, sign a coin flip.
    assert!(
        chi_square_uniform(&ops) < chi_square_limit(13),
        "ops {ops:?}"
    );
    assert!(
        chi_square_uniform(&bins) < chi_square_limit(30),
        "bins {bins:?}"
    );
    assert!(
        binomial_ok(negative, signed, 0.5),
        "{negative} of {signed} negative"
    );
}

#[test]
fn rand_augment_draws_torchvisions_distribution() {
    let drawn = draws_of(Augment::RandAugment {
        num_ops: 2,
        magnitude: 9,
    });
    let mut ops = [0u64; 14];
    let (mut signed, mut negative) = (0u64, 0u64);
    for image in &drawn {
        assert_eq!(image.len(), 2, "num_ops operations an image");
        for &(t, m) in image {
            ops[policy::RAND_SPACE
                .iter()
                .position(|&s| s == t)
                .expect("in the space")] += 1;
            if let Some((bin, neg)) = bin_of(t, Ranges::Standard, 31, m) {
                // Every magnitude is bin 9's (Posterize's bins repeat their values).
                let table = policy::magnitudes(t, Ranges::Standard, 31, 224, 224).expect("table");
                assert_eq!(f64::from(table.0[9]), m.abs(), "{t:?} bin {bin}");
                if is_signed(t, Ranges::Standard, 31) {
                    signed += 1;
                    negative += u64::from(neg);
                }
            }
        }
    }
    assert!(
        chi_square_uniform(&ops) < chi_square_limit(13),
        "ops {ops:?}"
    );
    assert!(
        binomial_ok(negative, signed, 0.5),
        "{negative} of {signed} negative"
    );
}

#[test]
fn auto_augment_draws_its_imagenet_sub_policies() {
    let drawn = draws_of(Augment::AutoAugment);
    // Each sub-policy 1/25 of the time, each of its operations with its probability: the rate
    // of every (transform, magnitude bin) is the policy's sum of p / 25 over its entries.
    let mut expected = std::collections::HashMap::<(Transform, usize), f64>::new();
    for sub in policy::IMAGENET_POLICY {
        for (t, p, bin) in sub {
            *expected.entry((t, bin.unwrap_or(0))).or_default() += p / 25.0;
        }
    }
    let mut seen = std::collections::HashMap::<(Transform, usize), u64>::new();
    let (mut signed, mut negative) = (0u64, 0u64);
    for image in &drawn {
        assert!(image.len() <= 2);
        for &(t, m) in image {
            let (bin, neg) = bin_of(t, Ranges::Standard, 10, m).unwrap_or((0, false));
            // Posterize's table repeats values: name its bins by the policy's.
            let bin = match t {
                Transform::Posterize => [8, 7, 6, 5]
                    .into_iter()
                    .find(|&b| {
                        let v = policy::magnitudes(t, Ranges::Standard, 10, 224, 224)
                            .expect("table")
                            .0[b];
                        f64::from(v) == m
                    })
                    .expect("a policy bin"),
                _ => bin,
            };
            *seen.entry((t, bin)).or_default() += 1;
            if is_signed(t, Ranges::Standard, 10) && m != 0.0 {
                signed += 1;
                negative += u64::from(neg);
            }
        }
    }
    for (key, p) in &expected {
        let count = seen.get(key).copied().unwrap_or(0);
        let rate = p.min(1.0);
        // Posterize bins 7 and 6 (and 5 and 4...) share values; they are checked together below.
        if key.0 == Transform::Posterize {
            continue;
        }
        assert!(
            binomial_ok(count, DRAWS as u64, rate),
            "{key:?}: {count} of {DRAWS}, rate {p}"
        );
    }
    assert!(
        seen.keys().all(|k| expected.contains_key(k)),
        "only the policy's operations: {:?}",
        seen.keys().collect::<Vec<_>>()
    );
    assert!(
        binomial_ok(negative, signed, 0.5),
        "{negative} of {signed} negative"
    );
}

#[test]
fn jitter_and_erasing_draw_torchvisions_parameters() {
    let augmenter = Augmenter {
        options: AugmentOptions::default()
            .color_jitter(ColorJitter {
                brightness: 0.4,
                contrast: 0.3,
                saturation: 0.2,
                hue: 0.1,
            })
            .random_erasing(Some(RandomErasing::new(0.25))),
        seed: 11,
        width: 224,
        height: 160,
    };
    let mut erased = 0u64;
    let mut first = [0u64; 4];
    for index in 0..DRAWS {
        let ops = augmenter.image_ops(index, 0);
        let kind = |op: &Op| match op {
            Op::Brightness(f) if (0.6..=1.4).contains(f) => 0,
            Op::Contrast(f) if (0.7..=1.3).contains(f) => 1,
            Op::Saturation(f) if (0.8..=1.2).contains(f) => 2,
            Op::Hue(f) if (-0.1..=0.1).contains(f) => 3,
            other => panic!("not a jitter in its range: {other:?}"),
        };
        let mut kinds: Vec<usize> = ops[..4].iter().map(kind).collect();
        first[kinds[0]] += 1;
        kinds.sort_unstable();
        assert_eq!(
            kinds,
            [0, 1, 2, 3],
            "each adjustment once, in a random order"
        );
        if let Some(Op::Erase { i, j, h, w, .. }) = ops.get(4) {
            erased += 1;
            assert!(i + h <= 160 && j + w <= 224 && *h < 160 && *w < 224);
            let area = f64::from(h * w) / (224.0 * 160.0);
            assert!((0.015..0.35).contains(&area), "{area}");
        }
    }
    assert!(
        chi_square_uniform(&first) < chi_square_limit(3),
        "{first:?}"
    );
    // p = 0.25, less the rare images where no box fits in ten tries.
    assert!((23_500..=25_800).contains(&erased), "{erased} erased");
}

#[test]
fn draws_depend_on_seed_epoch_and_index_alone() {
    let augmenter = |seed| Augmenter {
        options: Recipe::TorchvisionImagenet.augment_options(),
        seed,
        width: 224,
        height: 224,
    };
    let a = augmenter(1);
    let ops: Vec<ImageOps> = (0..200).map(|i| a.image_ops(i, 2)).collect();
    assert_eq!(ops, (0..200).map(|i| a.image_ops(i, 2)).collect::<Vec<_>>());
    assert_ne!(ops, (0..200).map(|i| a.image_ops(i, 3)).collect::<Vec<_>>());
    assert_ne!(
        ops,
        (0..200)
            .map(|i| augmenter(2).image_ops(i, 2))
            .collect::<Vec<_>>()
    );
    // A plan is its rows' draws whatever else the batch holds.
    let plan = a.plan(&[5, 9, 7], 2, 4);
    assert_eq!(plan.rows[1], a.image_ops(9, 2));
    assert_eq!(plan.mix, a.batch_mix(4, 2));
    assert!(plan.mix.is_some());
    let mixes: Vec<Option<Mix>> = (0..50).map(|b| a.batch_mix(b, 2)).collect();
    assert!(mixes.windows(2).any(|w| w[0] != w[1]));
}

#[test]
fn a_batch_is_its_rows_augmented_one_by_one() {
    let augmenter = Augmenter {
        options: AugmentOptions::default()
            .policy(Augment::RandAugment {
                num_ops: 4,
                magnitude: 20,
            })
            .color_jitter(ColorJitter {
                brightness: 0.5,
                contrast: 0.5,
                saturation: 0.5,
                hue: 0.3,
            })
            .random_erasing(Some(RandomErasing::new(0.5))),
        seed: 9,
        width: 37,
        height: 29,
    };
    let (h, w) = (29, 37);
    let indices: Vec<usize> = (0..12).collect();
    let plan = augmenter.plan(&indices, 0, 0);
    let mut batch = gpufeed_bench::upload::random_bytes(12 * h * w * 3, 4);
    let original = batch.clone();
    augment_batch(&mut batch, h, w, &plan);
    for (row, ops) in plan.rows.iter().enumerate() {
        let mut one = original[row * h * w * 3..(row + 1) * h * w * 3].to_vec();
        apply_ops(ops, &mut one, h, w).expect("apply");
        assert_eq!(
            one,
            batch[row * h * w * 3..(row + 1) * h * w * 3],
            "row {row}"
        );
    }
}

/// `kernels/augment.cu` itself, compiled for the CPU by `tests/augment/kernel_harness.cpp`
/// (CUDA's built-ins as shims, one thread per block) and run on every golden call: the kernel's
/// arithmetic against torchvision's outputs without a GPU. Skipped, and said so, without g++.
fn kernel_source_on_the_cpu(cases: &[u8]) {
    use std::io::Write as _;
    use std::process::Command;
    let dir = std::env::temp_dir().join(format!("gpufeed-kernel-harness-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (binary, file) = (dir.join("harness"), dir.join("cases.bin"));
    let built = Command::new("g++")
        .args(["-O1", "-ffp-contract=off", "-Wno-unknown-pragmas", "-o"])
        .arg(&binary)
        .arg("tests/augment/kernel_harness.cpp")
        .status();
    match built {
        Ok(status) => assert!(
            status.success(),
            "the kernel source does not compile for the CPU"
        ),
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the kernel source on the CPU: no g++ ({e})"
            );
            return;
        }
    }
    std::fs::write(&file, cases).expect("cases");
    let out = Command::new(&binary)
        .arg(&file)
        .output()
        .expect("run the harness");
    let _ = std::fs::remove_dir_all(&dir);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the kernel differs from torchvision:\n{report}"
    );
    assert!(report.contains(" 0 differ"), "{report}");
}
