//! Where a batch's views lie: one block per group, each `[count, batch, size, size, 3]` u8 (view
//! `j` of the group for every image, then view `j + 1`), the blocks one after another at offsets
//! aligned for the normalize kernel's vector loads; normalized group by group, each group as
//! `count * batch` images. The CPU lane alone writes them there as it makes a batch (batches
//! for the CPU). Lanes working ahead of the batches (batches for a CUDA device) write each image's
//! views as one record instead ([`ViewLayout::record_bytes`]: its views one after another), a
//! record a place, which the device then unpacks into the blocks.

use super::Views;

/// Block offsets, and views' offsets in a record, are multiples of this many bytes (the
/// normalize kernel loads 16 at a time; the GPU lane's resize places a view by its offset in
/// these units, [`RECORD_UNIT`]).
const BLOCK_ALIGN: usize = 256;

/// The unit of a view's offset in a record and of a record's size, in bytes.
pub const RECORD_UNIT: usize = BLOCK_ALIGN;

/// One group's block in a batch's staging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupBlock {
    /// Where the block begins, in bytes.
    pub offset: usize,
    /// Views of each image in the group.
    pub count: usize,
    /// The views' side.
    pub size: usize,
}

impl GroupBlock {
    /// Bytes of one view, `size * size * 3`.
    pub fn view_bytes(&self) -> usize {
        self.size * self.size * 3
    }
}

/// The blocks of a batch of up to `batch` images' views.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewLayout {
    /// The groups' blocks, in group order.
    pub groups: Vec<GroupBlock>,
    /// Images a batch holds at most.
    pub batch: usize,
    /// Where each view lies in an image's record, in view order (group by group), in bytes.
    pub record: Vec<usize>,
    /// Bytes of one record, a multiple of [`RECORD_UNIT`].
    pub record_bytes: usize,
}

impl ViewLayout {
    /// The layout of batches of up to `batch` images of `views`.
    pub fn new(views: &Views, batch: usize) -> ViewLayout {
        let mut offset = 0usize;
        let groups = views
            .groups
            .iter()
            .map(|g| {
                let block = GroupBlock {
                    offset,
                    count: g.count as usize,
                    size: g.size as usize,
                };
                let bytes = block.count * batch * block.view_bytes();
                offset = (offset + bytes).next_multiple_of(BLOCK_ALIGN);
                block
            })
            .collect::<Vec<GroupBlock>>();
        let mut record = Vec::new();
        let mut at = 0usize;
        for g in &groups {
            for _ in 0..g.count {
                record.push(at);
                at = (at + g.view_bytes()).next_multiple_of(RECORD_UNIT);
            }
        }
        ViewLayout {
            groups,
            batch,
            record,
            record_bytes: at.max(RECORD_UNIT),
        }
    }

    /// An image's record (`record_bytes` or more), split: its views' destinations in view order.
    pub fn split_record<'a>(&self, record: &'a mut [u8]) -> Vec<&'a mut [u8]> {
        let mut views = Vec::with_capacity(self.record.len());
        let mut rest = record;
        let mut at = 0usize;
        let sizes = self
            .groups
            .iter()
            .flat_map(|g| std::iter::repeat_n(g.view_bytes(), g.count));
        for (&offset, bytes) in self.record.iter().zip(sizes) {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(offset - at);
            let (view, tail) = tail.split_at_mut(bytes);
            views.push(view);
            rest = tail;
            at = offset + bytes;
        }
        views
    }

    /// For each view (in view order): its group, its number `j` in the group and its offset in
    /// a record.
    pub fn record_views(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(group, g)| (0..g.count).map(move |j| (group, j)))
            .zip(&self.record)
            .map(|((group, j), &offset)| (group, j, offset))
    }

    /// Bytes of the staging of one batch.
    pub fn slot_bytes(&self) -> usize {
        self.groups
            .last()
            .map_or(0, |g| g.offset + g.count * self.batch * g.view_bytes())
    }

    /// Bytes of every view of one image.
    pub fn image_bytes(&self) -> usize {
        self.groups.iter().map(|g| g.count * g.view_bytes()).sum()
    }

    /// Views of each image, all groups together.
    pub fn views(&self) -> usize {
        self.groups.iter().map(|g| g.count).sum()
    }

    /// Where view `j` of group `group` of the image in place `place` lies, while the batch is
    /// being filled (`batch` places a view).
    pub fn range(&self, group: usize, j: usize, place: usize) -> std::ops::Range<usize> {
        let g = &self.groups[group];
        let start = g.offset + (j * self.batch + place) * g.view_bytes();
        start..start + g.view_bytes()
    }

    /// The views of images `first..first + count` of `pixels` (a batch's staging), split: for
    /// each image, its views' destinations in view order (group by group).
    pub fn split<'a>(
        &self,
        pixels: &'a mut [u8],
        first: usize,
        count: usize,
    ) -> Vec<Vec<&'a mut [u8]>> {
        let mut images: Vec<Vec<&'a mut [u8]>> = (0..count)
            .map(|_| Vec::with_capacity(self.views()))
            .collect();
        let mut rest = pixels;
        let mut at = 0usize;
        for g in &self.groups {
            let block_bytes = g.count * self.batch * g.view_bytes();
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(g.offset - at);
            let (block, tail) = tail.split_at_mut(block_bytes);
            rest = tail;
            at = g.offset + block_bytes;
            for (k, view) in block.chunks_mut(g.view_bytes()).enumerate() {
                let place = k % self.batch;
                if (first..first + count).contains(&place) {
                    images[place - first].push(view);
                }
            }
        }
        images
    }

    /// Moves the views of the image in place `from` to place `to` (closing a failed image's
    /// gap).
    pub fn move_image(&self, pixels: &mut [u8], from: usize, to: usize) {
        for (group, g) in self.groups.iter().enumerate() {
            for j in 0..g.count {
                let src = self.range(group, j, from);
                pixels.copy_within(src, self.range(group, j, to).start);
            }
        }
    }

    /// Packs a batch of `n` images: each group's block becomes `[count, n, size, size, 3]`,
    /// from its offset (a no-op for a full batch).
    pub fn pack(&self, pixels: &mut [u8], n: usize) {
        if n >= self.batch {
            return;
        }
        for g in &self.groups {
            let run = n * g.view_bytes();
            for j in 1..g.count {
                let from = g.offset + j * self.batch * g.view_bytes();
                pixels.copy_within(from..from + run, g.offset + j * run);
            }
        }
    }

    /// Where group `group`'s packed block of a batch of `n` images lies.
    pub fn packed(&self, group: usize, n: usize) -> std::ops::Range<usize> {
        let g = &self.groups[group];
        g.offset..g.offset + g.count * n * g.view_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_and_split_pack_and_move_agree() {
        let views = Views::new(vec![
            crate::views::ViewGroup::new(3, 2),
            crate::views::ViewGroup::new(2, 3),
        ]);
        let layout = ViewLayout::new(&views, 4);
        assert_eq!(layout.groups[0].offset, 0);
        assert_eq!(layout.groups[1].offset, 256);
        assert_eq!(layout.slot_bytes(), 256 + 3 * 4 * 12);
        assert_eq!(layout.image_bytes(), 2 * 27 + 3 * 12);
        let mut pixels = vec![0u8; layout.slot_bytes()];
        // Images 1..4 write their place and view number into every byte of their views.
        for (k, image) in layout.split(&mut pixels, 1, 3).into_iter().enumerate() {
            assert_eq!(image.len(), 5);
            for (v, view) in image.into_iter().enumerate() {
                view.fill((10 * (k + 1) + v) as u8);
            }
        }
        assert_eq!(pixels[layout.range(1, 2, 3)], [34u8; 12]);
        assert_eq!(pixels[layout.range(0, 0, 0)], [0u8; 27]);
        // Place 3's views move to place 2 (as when image 2 failed), then 3 places are packed.
        layout.move_image(&mut pixels, 3, 2);
        assert_eq!(pixels[layout.range(1, 1, 2)], [33u8; 12]);
        layout.pack(&mut pixels, 3);
        let g1 = layout.packed(1, 3);
        assert_eq!(g1.len(), 3 * 3 * 12);
        // Group 1 packed: view j of place p at (j * 3 + p) * 12.
        let at = |j: usize, p: usize| g1.start + (j * 3 + p) * 12;
        assert_eq!(pixels[at(2, 1)], 14);
        assert_eq!(pixels[at(2, 2)], 34);
        assert_eq!(pixels[at(0, 2)], 32);
        let g0 = layout.packed(0, 3);
        assert_eq!(pixels[g0.start + 27 * 4], 11);
    }

    #[test]
    fn a_record_holds_each_view_at_an_aligned_offset() {
        let views = Views::new(vec![
            crate::views::ViewGroup::new(3, 2),
            crate::views::ViewGroup::new(2, 3),
        ]);
        let layout = ViewLayout::new(&views, 4);
        assert_eq!(layout.record, [0, 256, 512, 768, 1024]);
        assert_eq!(layout.record_bytes, 1280);
        let mut record = vec![0u8; layout.record_bytes];
        let split = layout.split_record(&mut record);
        let lens: Vec<usize> = split.iter().map(|v| v.len()).collect();
        assert_eq!(lens, [27, 27, 12, 12, 12]);
        for (v, view) in split.into_iter().enumerate() {
            view.fill(v as u8 + 1);
        }
        assert_eq!(record[512..524], [3u8; 12]);
        assert_eq!(record[524], 0);
        let listed: Vec<_> = layout.record_views().collect();
        assert_eq!(listed[3], (1, 1, 768));
        let dinov2 = ViewLayout::new(&Views::dinov2(), 8);
        assert_eq!(dinov2.record_bytes, 2 * 224 * 224 * 3 + 8 * 96 * 96 * 3);
    }
}
