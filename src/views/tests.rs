use super::*;

fn blurred(d: &ViewDraw) -> bool {
    d.ops.iter().any(|op| matches!(op, ViewOp::Blur { .. }))
}

#[test]
fn draws_depend_on_seed_epoch_index_and_view_only() {
    let views = Views::dinov2().seed(7);
    let a = views.draw_all(640, 480, 3, 1);
    assert_eq!(a.len(), 10);
    assert_eq!(a, views.draw_all(640, 480, 3, 1));
    assert_ne!(a, views.draw_all(640, 480, 4, 1));
    assert_ne!(a, views.draw_all(640, 480, 3, 2));
    assert_ne!(a, Views::dinov2().seed(8).draw_all(640, 480, 3, 1));
    // Each view its own stream: no two views drew the same box.
    for (i, x) in a.iter().enumerate() {
        assert_eq!(x.view, i);
        for y in &a[i + 1..] {
            assert_ne!(x.crop, y.crop);
        }
    }
    assert!(views.draw(640, 480, 3, 1, 10).is_none());
}

#[test]
fn boxes_follow_their_groups_scale_and_fit_the_image() {
    let views = Views::dinov2();
    let (w, h) = (500u32, 375u32);
    let area = f64::from(w * h);
    for index in 0..300 {
        for d in views.draw_all(w, h, index, 0) {
            let c = d.crop;
            assert!(c.left + c.width <= w && c.top + c.height <= h, "{d:?}");
            let share = f64::from(c.width * c.height) / area;
            let (lo, hi) = if d.group < 2 {
                (0.32, 1.0)
            } else {
                (0.05, 0.32)
            };
            // Rounding of the sides moves the share by a little.
            assert!(share > lo * 0.95 && share < hi * 1.05, "{share} {d:?}");
            assert_eq!(d.size, if d.group < 2 { 224 } else { 96 });
        }
    }
}

#[test]
fn chances_are_dinov2s() {
    let views = Views::dinov2();
    let n = 4000;
    let mut counts = [[0u32; 5]; 3];
    for index in 0..n {
        for d in views.draw_all(800, 600, index, 0) {
            let g = &mut counts[d.group];
            g[0] += u32::from(d.crop.flipped);
            g[1] += u32::from(d.ops.iter().any(|op| matches!(op, ViewOp::Brightness(_))));
            g[2] += u32::from(d.ops.contains(&ViewOp::Grayscale));
            g[3] += u32::from(blurred(&d));
            g[4] += u32::from(d.ops.contains(&ViewOp::Solarize(128)));
        }
    }
    let share = |c: u32, views: u32| f64::from(c) / f64::from(n as u32 * views);
    let near = |c: u32, views: u32, p: f64| (share(c, views) - p).abs() < 0.03;
    // Global 1: never blurred (DINOv2's `GaussianBlur(p=1.0)` keeps the image with chance 1).
    assert_eq!(counts[0][3], 0);
    assert_eq!(counts[0][4], 0);
    assert!(near(counts[0][0], 1, 0.5) && near(counts[0][1], 1, 0.8));
    assert!(near(counts[0][2], 1, 0.2));
    // Global 2: blurred with chance 0.9, solarized with 0.2.
    assert!(near(counts[1][3], 1, 0.9) && near(counts[1][4], 1, 0.2));
    // Local: blurred with chance 0.5, never solarized.
    assert!(near(counts[2][3], 8, 0.5) && counts[2][4] == 0);
    assert!(near(counts[2][1], 8, 0.8));
}

#[test]
fn jitter_factors_stay_in_their_ranges_and_take_every_order() {
    let views = Views::simclr();
    let mut orders = std::collections::HashSet::new();
    for index in 0..500 {
        for d in views.draw_all(300, 200, index, 0) {
            let mut order = Vec::new();
            for op in &d.ops {
                match *op {
                    ViewOp::Brightness(f) | ViewOp::Contrast(f) | ViewOp::Saturation(f) => {
                        assert!((0.2..=1.8).contains(&f), "{op:?}");
                        order.push(op.json().chars().nth(2));
                    }
                    ViewOp::Hue(f) => {
                        assert!((-0.2..=0.2).contains(&f), "{op:?}");
                        order.push(Some('h'));
                    }
                    ViewOp::Blur { kernel_size, sigma } => {
                        assert_eq!(kernel_size, 23);
                        assert!((0.1..=2.0).contains(&sigma));
                    }
                    _ => {}
                }
            }
            assert!(order.is_empty() || order.len() == 4, "{:?}", d.ops);
            orders.insert(order);
        }
    }
    // 24 permutations, and no jitter.
    assert_eq!(orders.len(), 25);
}

#[test]
fn a_draw_prints_as_one_json_line() {
    let d = Views::dinov2().draw(640, 480, 5, 2, 1).unwrap();
    let line = d.json(5, 2);
    assert!(!line.contains('\n'));
    assert!(line.starts_with("{\"index\": 5, \"epoch\": 2, \"view\": 1, \"group\": 1"));
    assert_eq!(ViewOp::Brightness(1.5).json(), "[\"brightness\", 1.5]");
    assert_eq!(ViewOp::Solarize(128).json(), "[\"solarize\", 128]");
    assert_eq!(
        ViewOp::Blur {
            kernel_size: 9,
            sigma: 0.1
        }
        .json(),
        format!("[\"blur\", 9, {:?}]", f64::from(0.1f32))
    );
}
