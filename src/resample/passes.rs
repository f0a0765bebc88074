//! Pillow's passes (`ImagingResampleInner`): each resampled axis is one pass over the 8-bit
//! samples; when both are, the first writes an 8-bit intermediate (rounded and clamped between
//! the passes), so which pass runs first shows in the result. Pillow changed that order in 12.2
//! and again in 13.0 ([`PassOrder`]). With the horizontal pass first, only the source rows the
//! vertical pass reads are resampled.

use super::coefficients::{axis_coefficients, AxisCoefficients};
use super::filter::{Filter, Resampling};
use super::plan::{Axis, AxisPlan, PlanError};

/// Which Pillow's choice of first pass to reproduce when both axes are resampled. The passes
/// round to 8 bits in between, so the order shows in the output: a level up or down at places.
/// Pillow has changed it twice; [`PassOrder::for_pillow`] picks the one of a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[allow(clippy::enum_variant_names)]
pub enum PassOrder {
    /// Pillow 13.0 and later (`ImagingResampleInner`): the vertical pass first when the height
    /// shrinks by more than twice as many samples as the width
    /// (`src_h - h > 0 && src_h - h > 2 * (src_w - w)`, sizes of the region and its resize).
    #[default]
    ShrinkVerticalFirst,
    /// Pillow 12.2 and 12.3 (`Image.resize`): the vertical pass first for an image more than 100
    /// times taller than wide whose height shrinks (`src_h > 100 * src_w && h < src_h`).
    TallVerticalFirst,
    /// Pillow 12.1 and earlier: the horizontal pass first, always.
    HorizontalFirst,
}

impl PassOrder {
    /// The pass order of Pillow `major.minor`.
    pub fn for_pillow(major: u32, minor: u32) -> PassOrder {
        match (major, minor) {
            (13.., _) => PassOrder::ShrinkVerticalFirst,
            (12, 2..) => PassOrder::TallVerticalFirst,
            _ => PassOrder::HorizontalFirst,
        }
    }

    /// Whether Pillow runs the vertical pass first for the region of plans `x` and `y` (when
    /// both axes are resampled; a lone pass needs no order).
    pub fn vertical_first(self, x: &AxisPlan, y: &AxisPlan) -> bool {
        let (src_w, src_h) = (i64::from(x.src_len), i64::from(y.src_len));
        let (w, h) = (i64::from(x.resized), i64::from(y.resized));
        match self {
            PassOrder::ShrinkVerticalFirst => src_h - h > 0 && src_h - h > (src_w - w) * 2,
            PassOrder::TallVerticalFirst => src_h > src_w * 100 && h < src_h,
            PassOrder::HorizontalFirst => false,
        }
    }
}

/// The direction a pass filters along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Along rows (`ImagingResampleHorizontal_8bpc`).
    Horizontal,
    /// Along columns (`ImagingResampleVertical_8bpc`).
    Vertical,
}

/// One pass over a rectangle of its input. Output pixel (i, j), channel c, is
/// `clip8(HALF + sum(input[..] * weight))` over the taps of output i (horizontal: input row
/// `fixed_first + j`, columns `start_i..start_i + len_i`) or of output j (vertical: input column
/// `fixed_first + i`, rows `start_j..start_j + len_j`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The direction of the taps.
    pub direction: Direction,
    /// Bounds and weights per output column (horizontal) or row (vertical), in input columns or
    /// rows.
    pub coefficients: AxisCoefficients,
    /// The input row read by output row 0 (horizontal) or column read by output column 0
    /// (vertical); the others follow one for one.
    pub fixed_first: u32,
}

/// Pillow's passes for the output of two plans (`ImagingResampleInner`): each resampled axis is
/// one pass, in Pillow's order; only the rows (or columns) the second pass reads go through the
/// first, as Pillow does for the horizontal-first order (the vertical-first order resamples every
/// column, of which the kept ones are the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassPlan {
    /// The pass from the source region into the 8-bit intermediate, when both axes are
    /// resampled.
    pub first: Option<Pass>,
    /// The intermediate's width and height in pixels; zero without a first pass.
    pub intermediate: (u32, u32),
    /// The pass into the kept rectangle of the output, from the intermediate after a first pass,
    /// else from the source region. With neither axis resampled it is a vertical copy (one tap
    /// of weight [`ONE`](super::coefficients::ONE) per row).
    pub last: Pass,
    /// The columns of the source image the passes read, the region's offset included...
    pub source_columns: std::ops::Range<u32>,
    /// ...and the rows: what its decode must give exactly.
    pub source_rows: std::ops::Range<u32>,
}

impl PassPlan {
    /// Whether the horizontal pass runs first (both axes resampled, horizontal first).
    #[cfg(test)]
    pub fn horizontal_first(&self) -> bool {
        self.first
            .as_ref()
            .is_some_and(|p| p.direction == Direction::Horizontal)
    }
}

/// Pillow's pass structure for the output of plans `x` and `y` under `filter`, in the pass
/// order of `order`.
pub fn plan_passes(
    x: &AxisPlan,
    y: &AxisPlan,
    filter: Filter,
    order: PassOrder,
) -> Result<PassPlan, PlanError> {
    let xc = axis_coefficients(x, Resampling::Filter(filter), Axis::X)?;
    let yc = axis_coefficients(y, Resampling::Filter(filter), Axis::Y)?;
    Ok(passes_of(x, y, xc, yc, order.vertical_first(x, y)))
}

/// [`plan_passes`] for a resize on the device: the weights of a bilinear or bicubic axis left to
/// its kernel ([`WeightRule`](super::WeightRule), the host's double operations there), the
/// bounds and the passes the same as `plan_passes`'s. Other filters' weights are computed here.
pub fn plan_passes_weights_on_device(
    x: &AxisPlan,
    y: &AxisPlan,
    filter: Filter,
    order: PassOrder,
) -> Result<PassPlan, PlanError> {
    let mut xc = AxisCoefficients::default();
    let mut yc = AxisCoefficients::default();
    xc.compute_bounds(x, filter, Axis::X)?;
    yc.compute_bounds(y, filter, Axis::Y)?;
    Ok(passes_of(x, y, xc, yc, order.vertical_first(x, y)))
}

/// The passes torchvision's resize of a `uint8` tensor runs on the CPU for plans `x` and `y`
/// under `filter` (bilinear or bicubic): PyTorch's 16-bit weights ([`super::torch`]), the width
/// first, in the same pass structure (the same kernels run them).
pub fn plan_passes_torchvision(
    x: &AxisPlan,
    y: &AxisPlan,
    filter: Filter,
) -> Result<PassPlan, PlanError> {
    let mut xc = AxisCoefficients::default();
    let mut yc = AxisCoefficients::default();
    super::torch::compute(&mut xc, x, filter, Axis::X)?;
    super::torch::compute(&mut yc, y, filter, Axis::Y)?;
    Ok(passes_of(x, y, xc, yc, false))
}

/// The pass structure of plans `x` and `y` with their coefficients, the vertical pass first
/// (when both axes are resampled) if `vertical_first`.
fn passes_of(
    x: &AxisPlan,
    y: &AxisPlan,
    xc: AxisCoefficients,
    yc: AxisCoefficients,
    vertical_first: bool,
) -> PassPlan {
    let pass = |direction, coefficients, fixed_first| Pass {
        direction,
        coefficients,
        fixed_first,
    };
    let (source_columns, source_rows) = (xc.source_span(x), yc.source_span(y));
    let (first, intermediate, last) = match (xc.resampled, yc.resampled) {
        (true, true) if vertical_first => {
            let (first, end) = xc.span();
            (
                Some(pass(Direction::Vertical, yc, first)),
                (end - first, y.out_len),
                pass(Direction::Horizontal, xc.shifted(first), 0),
            )
        }
        (true, true) => {
            let (first, end) = yc.span();
            (
                Some(pass(Direction::Horizontal, xc, first)),
                (x.out_len, end - first),
                pass(Direction::Vertical, yc.shifted(first), 0),
            )
        }
        (true, false) => {
            let rows = yc.span().0;
            (None, (0, 0), pass(Direction::Horizontal, xc, rows))
        }
        (false, _) => {
            let columns = xc.span().0;
            (None, (0, 0), pass(Direction::Vertical, yc, columns))
        }
    };
    PassPlan {
        first,
        intermediate,
        last,
        source_columns,
        source_rows,
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::torchvision_center_crop;
    use super::*;

    #[test]
    fn the_first_pass_covers_only_what_the_second_reads() {
        let (x, y) = torchvision_center_crop(500, 375, 256, 224, 224);
        let p =
            plan_passes(&x, &y, Filter::Bilinear, PassOrder::ShrinkVerticalFirst).expect("plan");
        assert!(
            p.horizontal_first(),
            "119 rows less is not twice 159 columns less"
        );
        let first = p.first.as_ref().expect("both axes are resampled");
        let rows = first.fixed_first;
        assert!(
            rows > 0 && rows + p.intermediate.1 < 375,
            "{rows} + {}",
            p.intermediate.1
        );
        assert_eq!(p.intermediate.0, 224);
        assert_eq!(p.last.direction, Direction::Vertical);
        assert_eq!(
            p.last.coefficients.bounds[0].0, 0,
            "bounds shifted to the intermediate"
        );
    }

    #[test]
    fn pillow_13_shrinks_tall_images_vertically_first() {
        // 100x1000 -> 50x300: 700 rows less is more than twice 50 columns less.
        let (x, y) = (AxisPlan::stretch(100, 50), AxisPlan::stretch(1000, 300));
        let p = plan_passes(&x, &y, Filter::Bicubic, PassOrder::ShrinkVerticalFirst).expect("plan");
        let first = p.first.as_ref().expect("both axes are resampled");
        assert_eq!(first.direction, Direction::Vertical);
        assert_eq!(p.intermediate, (100, 300));
        assert_eq!(p.last.direction, Direction::Horizontal);
        let p12 = plan_passes(&x, &y, Filter::Bicubic, PassOrder::HorizontalFirst).expect("plan");
        assert!(p12.horizontal_first());
        // Growing the height never goes vertical first; neither does shrinking it by exactly
        // twice the width's shrink.
        let order = PassOrder::ShrinkVerticalFirst;
        assert!(!order.vertical_first(&x, &AxisPlan::stretch(1000, 1200)));
        assert!(!order.vertical_first(&x, &AxisPlan::stretch(1000, 900)));
        assert!(order.vertical_first(&x, &AxisPlan::stretch(1000, 899)));
    }

    #[test]
    fn pillow_12_2_shrinks_only_very_tall_images_vertically_first() {
        let order = PassOrder::for_pillow(12, 3);
        assert_eq!(order, PassOrder::TallVerticalFirst);
        let (x, y) = (AxisPlan::stretch(3, 2), AxisPlan::stretch(301, 100));
        assert!(
            order.vertical_first(&x, &y),
            "301 > 100 * 3, and the height shrinks"
        );
        assert!(!order.vertical_first(&x, &AxisPlan::stretch(300, 100)));
        assert!(!order.vertical_first(&x, &AxisPlan::stretch(301, 400)));
        assert_eq!(PassOrder::for_pillow(12, 1), PassOrder::HorizontalFirst);
        assert_eq!(PassOrder::for_pillow(11, 3), PassOrder::HorizontalFirst);
        assert_eq!(PassOrder::for_pillow(13, 0), PassOrder::default());
    }

    #[test]
    fn a_lone_resampled_axis_is_one_pass_from_the_source() {
        let x = AxisPlan {
            src_box: None,
            src_offset: 0,
            src_len: 40,
            resized: 40,
            out_first: 7,
            out_len: 20,
            dst_offset: 0,
        };
        let y = AxisPlan::stretch(30, 12);
        let p = plan_passes(&x, &y, Filter::Lanczos, PassOrder::ShrinkVerticalFirst).expect("plan");
        assert!(p.first.is_none());
        assert_eq!(
            (p.last.direction, p.last.fixed_first),
            (Direction::Vertical, 7)
        );
        let p = plan_passes(&y, &x, Filter::Lanczos, PassOrder::ShrinkVerticalFirst).expect("plan");
        assert_eq!(
            (p.last.direction, p.last.fixed_first),
            (Direction::Horizontal, 7)
        );
    }
}
