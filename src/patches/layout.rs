//! Where each value of a patch sequence comes from, and where each image's tokens go in a batch.
//!
//! A token is one patch (Qwen2-VL: one patch repeated along time); its values are the patch's
//! pixels in the model's order ([`TokenOrder`]). A batch holds the images' tokens one after the
//! other, packed (`cu_seqlens` marks where each image starts) or each padded to one length with
//! a mask and patch coordinates ([`Packing`], [`BatchLayout`]).

/// The order of tokens in an image and of values in a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenOrder {
    /// Qwen2-VL's `patchify`: the grid is cut into `merge` x `merge` blocks, taken row by row,
    /// each block's patches row by row; a token's values are `(channel, time, row, column)`,
    /// the still image repeated `temporal` times along time.
    Merged {
        /// Patches merged along each side (`merge_size`).
        merge: u32,
        /// Frames per temporal patch (`temporal_patch_size`).
        temporal: u32,
    },
    /// SigLIP2's and timm's: patches row by row; a token's values `(row, column, channel)`.
    RowMajorChannelsLast,
}

impl TokenOrder {
    /// Values per token for patches of `patch` x `patch` pixels of 3 channels.
    pub fn patch_dim(self, patch: u32) -> usize {
        let pixels = patch as usize * patch as usize * 3;
        match self {
            TokenOrder::Merged { temporal, .. } => pixels * temporal as usize,
            TokenOrder::RowMajorChannelsLast => pixels,
        }
    }

    /// The patch (row, column) of token `k` of an image `grid_w` patches wide.
    pub fn token_patch(self, k: u32, grid_w: u32) -> (u32, u32) {
        match self {
            TokenOrder::Merged { merge, .. } => {
                let per_block = merge * merge;
                let (block, within) = (k / per_block, k % per_block);
                let blocks_wide = grid_w / merge;
                let (bh, bw) = (block / blocks_wide, block % blocks_wide);
                (bh * merge + within / merge, bw * merge + within % merge)
            }
            TokenOrder::RowMajorChannelsLast => (k / grid_w, k % grid_w),
        }
    }

    /// The (channel, row, column) within the patch of value `d` of a token.
    pub fn value_source(self, d: u32, patch: u32) -> (u32, u32, u32) {
        let area = patch * patch;
        match self {
            TokenOrder::Merged { temporal, .. } => {
                let c = d / (temporal * area);
                let within = d % area;
                (c, within / patch, within % patch)
            }
            TokenOrder::RowMajorChannelsLast => {
                let pixel = d / 3;
                (d % 3, pixel / patch, pixel % patch)
            }
        }
    }
}

/// How the images of a batch share the token dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Packing {
    /// One after the other, `[total tokens, patch_dim]`, with each image's start in
    /// `cu_seqlens` (variable-length attention).
    Packed,
    /// Each image padded to `len` tokens, `[images, len, patch_dim]`, with a mask (1 for an
    /// image's tokens) and each token's patch (row, column).
    Padded {
        /// Tokens per image, the padding included.
        len: u32,
    },
}

/// One image's tokens: its grid and where they start in the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageTokens {
    /// Patches down the image.
    pub grid_h: u32,
    /// Patches across the image.
    pub grid_w: u32,
    /// The batch row of its first token.
    pub first_row: usize,
    /// Rows it owns: its tokens, or the padded length.
    pub rows: usize,
}

impl ImageTokens {
    /// Tokens of the image (padding aside).
    pub fn tokens(&self) -> usize {
        self.grid_h as usize * self.grid_w as usize
    }
}

/// Where every image's tokens go in a batch, and the side tensors that describe them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLayout {
    /// Per image.
    pub images: Vec<ImageTokens>,
    /// Rows of the token tensor.
    pub rows: usize,
    /// The packing.
    pub packing: Packing,
}

impl BatchLayout {
    /// The layout of images with these patch grids `(grid_h, grid_w)`. Padded, an image with
    /// more tokens than the length is refused (the planner never makes one).
    pub fn new(grids: &[(u32, u32)], packing: Packing) -> Result<BatchLayout, super::PatchError> {
        let mut images = Vec::with_capacity(grids.len());
        let mut rows = 0usize;
        for &(grid_h, grid_w) in grids {
            let tokens = grid_h as usize * grid_w as usize;
            let own = match packing {
                Packing::Packed => tokens,
                Packing::Padded { len } if tokens <= len as usize => len as usize,
                Packing::Padded { len } => {
                    return Err(super::PatchError::OverLength { tokens, len });
                }
            };
            images.push(ImageTokens {
                grid_h,
                grid_w,
                first_row: rows,
                rows: own,
            });
            rows += own;
        }
        Ok(BatchLayout {
            images,
            rows,
            packing,
        })
    }

    /// Each image's first row, then the total: flash attention's `cu_seqlens` (packed; padded,
    /// the padded starts).
    pub fn cu_seqlens(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.images.iter().map(|i| i.first_row as i32).collect();
        v.push(self.rows as i32);
        v
    }

    /// Per row: 1 for an image's token, 0 for padding.
    pub fn mask(&self) -> Vec<u8> {
        let mut mask = vec![0u8; self.rows];
        for image in &self.images {
            mask[image.first_row..image.first_row + image.tokens()].fill(1);
        }
        mask
    }

    /// Per row: the token's patch (row, column), in `order`; (0, 0) for padding.
    pub fn coordinates(&self, order: TokenOrder) -> Vec<[u32; 2]> {
        let mut coords = vec![[0u32; 2]; self.rows];
        for image in &self.images {
            let rows = &mut coords[image.first_row..image.first_row + image.tokens()];
            for (k, c) in rows.iter_mut().enumerate() {
                let (r, col) = order.token_patch(k as u32, image.grid_w);
                *c = [r, col];
            }
        }
        coords
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen_tokens_walk_merge_blocks() {
        // A 4 x 6 grid in 2 x 2 blocks: tokens 0..4 are the top-left block.
        let order = TokenOrder::Merged {
            merge: 2,
            temporal: 2,
        };
        let walk: Vec<_> = (0..8).map(|k| order.token_patch(k, 6)).collect();
        assert_eq!(
            walk,
            [
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (0, 2),
                (0, 3),
                (1, 2),
                (1, 3)
            ]
        );
        assert_eq!(order.token_patch(12, 6), (2, 0));
        assert_eq!(order.patch_dim(14), 1176);
        // (c, t, y, x): value 196 is channel 0, time 1, pixel (0, 0); 392 is channel 1.
        assert_eq!(order.value_source(196, 14), (0, 0, 0));
        assert_eq!(order.value_source(392 + 15, 14), (1, 1, 1));
    }

    #[test]
    fn channels_last_tokens_go_row_by_row() {
        let order = TokenOrder::RowMajorChannelsLast;
        assert_eq!(order.token_patch(7, 5), (1, 2));
        assert_eq!(order.patch_dim(16), 768);
        assert_eq!(order.value_source(0, 16), (0, 0, 0));
        assert_eq!(order.value_source(3 * 17 + 2, 16), (2, 1, 1));
    }

    #[test]
    fn packed_and_padded_layouts() {
        let grids = [(2, 3), (1, 1), (4, 2)];
        let packed = BatchLayout::new(&grids, Packing::Packed).expect("layout");
        assert_eq!(packed.rows, 15);
        assert_eq!(packed.cu_seqlens(), [0, 6, 7, 15]);
        let padded = BatchLayout::new(&grids, Packing::Padded { len: 8 }).expect("layout");
        assert_eq!(padded.rows, 24);
        let mask = padded.mask();
        assert_eq!(mask[..8], [1, 1, 1, 1, 1, 1, 0, 0]);
        assert_eq!(mask[8..10], [1, 0]);
        let coords = padded.coordinates(TokenOrder::RowMajorChannelsLast);
        assert_eq!(coords[5], [1, 2]);
        assert_eq!(coords[6], [0, 0]);
        assert_eq!(coords[16 + 7], [3, 1]);
        assert!(BatchLayout::new(&grids, Packing::Padded { len: 7 }).is_err());
    }
}
