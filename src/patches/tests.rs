use super::*;

#[test]
fn presets_parse_and_plan_their_grids() {
    for p in [Preset::Qwen2Vl, Preset::Siglip2Naflex, Preset::TimmNaflex] {
        assert_eq!(p.name().parse::<Preset>(), Ok(p));
        assert_eq!(Patches::preset(p).preset, p);
        Patches::preset(p)
            .validate()
            .expect("the defaults are valid");
    }
    assert!("qwen".parse::<Preset>().is_err());
    // A 451 x 300 image: transformers gives pixel_values (704, 1176) and grid (1, 22, 32).
    let q = Patches::qwen2_vl();
    let plan = q.plan(451, 300).expect("plan");
    assert_eq!((plan.grid_t, plan.grid_h, plan.grid_w), (1, 22, 32));
    assert_eq!((plan.tokens(), q.patch_dim()), (704, 1176));
    // SigLIP2: spatial shape (13, 19) of 256 patches of 768 values.
    let s = Patches::siglip2_naflex();
    let plan = s.plan(451, 300).expect("plan");
    assert_eq!((plan.grid_h, plan.grid_w, s.patch_dim()), (13, 19, 768));
    assert_eq!(s.packing(247, None), Packing::Padded { len: 256 });
    assert_eq!(q.packing(704, None), Packing::Packed);
}

#[test]
fn budgets_below_one_patch_are_option_errors() {
    let e = Patches::qwen2_vl()
        .max_pixels(700)
        .validate()
        .expect_err("too small");
    assert!(e.to_string().contains("max_pixels"), "{e}");
    assert!(Patches::qwen2_vl()
        .min_pixels(10_000)
        .max_pixels(5_000)
        .validate()
        .is_err());
    assert!(Patches::siglip2_naflex().max_patches(0).validate().is_err());
    assert!(Patches::timm_naflex().seq_lens(&[]).validate().is_err());
    assert!(Patches::timm_naflex()
        .tokens_per_batch(100)
        .validate()
        .is_err());
    let e = Patches::qwen2_vl().plan(10_000, 49).expect_err("aspect");
    assert!(e.to_string().contains("aspect ratio 204.1"), "{e}");
}

#[test]
fn images_smaller_than_a_patch_still_make_one() {
    let q = Patches::qwen2_vl().plan(1, 1).expect("plan");
    assert_eq!((q.width, q.height, q.grid_h, q.grid_w), (56, 56, 4, 4));
    let s = Patches::siglip2_naflex().plan(3, 2).expect("plan");
    assert!(s.grid_h >= 1 && s.grid_w >= 1);
    let t = Patches::timm_naflex()
        .plan_random(5, 3, 128, (1, 0, 0))
        .expect("plan");
    assert!(t.grid_h >= 1 && t.grid_w >= 1 && t.tokens() <= 128);
}

#[test]
fn timm_pads_with_a_normalized_black_pixel() {
    let t = Patches::timm_naflex();
    let pad = t.pad_values();
    assert_eq!(
        pad[0],
        (0.0 - (0.485f64 * 255.0) as f32) / (0.229f64 * 255.0) as f32
    );
    assert_eq!(Patches::siglip2_naflex().pad_values(), [0.0; 3]);
    assert_eq!(t.packing(100, Some(256)), Packing::Padded { len: 256 });
}
