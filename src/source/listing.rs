//! A fingerprint of a source's listing: every image's id and label, in order, folded into 64
//! bits as the listing is made, so a saved pipeline state can tell whether it is given the
//! listing it was saved from (a folder that gained, lost or renamed a file, or relabelled one)
//! without keeping the listing. Computed here, not with the standard library's hasher, whose
//! output may change between Rust releases: a state file outlives the build that wrote it.

use super::SourceItem;
use crate::order::ListingSummary;

/// The summary of `items`, in their order.
pub(crate) fn summarize(items: &[SourceItem]) -> ListingSummary {
    let mut fold = Fold::new();
    for item in items {
        fold.bytes(item.id().as_bytes());
        // `u64::MAX` for no label, which no `u32` label can be.
        fold.word(item.label().map_or(u64::MAX, u64::from));
    }
    fold.word(items.len() as u64);
    ListingSummary {
        images: items.len(),
        fingerprint: fold.finish(),
        first: items.first().map_or(String::new(), |i| i.id().to_string()),
        last: items.last().map_or(String::new(), |i| i.id().to_string()),
    }
}

/// Folds 64-bit words into a state with SplitMix64's finalizer, a bijection that spreads every
/// input bit over the whole state.
struct Fold(u64);

impl Fold {
    fn new() -> Fold {
        Fold(0x6A09_E667_F3BC_C908)
    }

    fn word(&mut self, word: u64) {
        let mut z = (self.0 ^ word).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.0 = z ^ (z >> 31);
    }

    /// Bytes eight at a time (the last word zero-filled), then their count, so that where one
    /// id ends and the next begins is part of the fingerprint.
    fn bytes(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut le = [0u8; 8];
            le.copy_from_slice(word);
            self.word(u64::from_le_bytes(le));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut le = [0u8; 8];
            le[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(le));
        }
        self.word(bytes.len() as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::super::Source;

    fn fingerprint(source: &Source) -> u64 {
        source.listing().fingerprint
    }

    #[test]
    fn the_fingerprint_follows_ids_order_and_labels() {
        let paths = |names: &[&str]| Source::paths(names.iter().map(|n| n.to_string()));
        let base = paths(&["a.jpg", "b.jpg", "c.jpg"]);
        assert_eq!(
            fingerprint(&base),
            fingerprint(&paths(&["a.jpg", "b.jpg", "c.jpg"]))
        );
        for other in [
            paths(&["a.jpg", "c.jpg", "b.jpg"]),
            paths(&["a.jpg", "b.jpg"]),
            paths(&["a.jpg", "b.jpg", "c.jpeg"]),
            // Where one id ends and the next begins counts.
            paths(&["a.jpgb.jpg", "", "c.jpg"]),
        ] {
            assert_ne!(fingerprint(&base), fingerprint(&other));
        }
        let labelled = base.clone().with_labels([0, 1, 2]).expect("labels");
        let relabelled = base.clone().with_labels([0, 2, 1]).expect("labels");
        assert_ne!(fingerprint(&base), fingerprint(&labelled));
        assert_ne!(fingerprint(&labelled), fingerprint(&relabelled));
        let summary = base.listing();
        assert_eq!(
            (
                summary.images,
                summary.first.as_str(),
                summary.last.as_str()
            ),
            (3, "a.jpg", "c.jpg")
        );
        // The same ids in memory are the same listing.
        let bytes = Source::bytes(["a.jpg", "b.jpg", "c.jpg"].map(|id| (id, vec![0u8; 4])));
        assert_eq!(fingerprint(&base), fingerprint(&bytes));
    }
}
