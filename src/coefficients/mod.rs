//! The exact GPU-assisted JPEG path's building blocks: CPU threads entropy-decode a JPEG with
//! libjpeg-turbo (coefficients only, [`turbojpeg_region::CoefficientReader`]), the coefficients
//! cross PCIe in a compact form, and GPU kernels do what libjpeg-turbo does next: its integer
//! inverse DCT, upsampling and colour conversion, bit for bit.
//!
//! - [`Layout`]: what libjpeg-turbo does with an image's components (which upsampling routine
//!   each gets, which colour conversion), and which blocks and iMCU rows an output [`Window`]
//!   needs;
//! - [`reference`](mod@reference): the CPU rendition, line by line after `jidctint.c`, `jdsample.c`
//!   and `jdcolor.c`: the test oracle of the kernels, and a fallback;
//! - [`pack`]: the transfer format, a window's blocks as nonzero masks and values;
//! - [`batch`]: a batch of packed images planned for the kernels;
//! - [`entropy`]: a baseline JPEG parsed for the GPU's own entropy decoding (its scan destuffed
//!   and cut at its restart markers, its Huffman tables in lookup form), so that the CPU decodes
//!   nothing; [`entropy_batch`]: a batch of them planned for `kernels/entropy.cu`;
//!   [`sync_passes`]: how many of its synchronisation passes a batch launches;
//! - [`progressive`]: progressive JPEGs entropy-decoded on the CPU into libjpeg-turbo's
//!   coefficients, faster than libjpeg-turbo reads them, for [`pack`];
//! - [`gpu`]: the kernels (`kernels/idct.cu`, `kernels/entropy.cu`) and their host side,
//!   batched over many images, packed and entropy-coded ones mixed, with buffers sized once
//!   from a byte budget.
//!
//! `docs/large-photos.md` describes the path, its exactness and its measured costs.

pub mod batch;
#[cfg(test)]
pub(crate) mod cases;
pub mod entropy;
pub mod entropy_batch;
#[cfg(test)]
mod entropy_gpu_tests;
#[cfg(test)]
mod entropy_host_check;
#[allow(unsafe_code)]
pub mod gpu;
#[cfg(test)]
mod gpu_tests;
#[cfg(test)]
mod host_check;
mod layout;
mod markers;
pub mod pack;
pub mod progressive;
#[cfg(test)]
mod progressive_tests;
pub mod reference;
pub mod sync_passes;
#[cfg(test)]
mod tests;

pub use layout::{BlockRect, ComponentLayout, Conversion, Layout, Upsampling, Window};

use turbojpeg_region::{CoefficientError, Coefficients};

/// What can go wrong on the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libjpeg-turbo could not read the coefficients.
    #[error(transparent)]
    Read(#[from] CoefficientError),
    /// A JPEG whose decode this path does not reproduce (CMYK, fractional sampling factors, a
    /// progressive file libjpeg would smooth): the full CPU decode takes it.
    #[error("not for the coefficient path: {0}")]
    Unsupported(String),
    /// A call that does not fit the image or the buffers.
    #[error("{0}")]
    Request(String),
    /// The GPU side failed (no device, a CUDA call, NVRTC).
    #[error(transparent)]
    Device(Box<crate::Error>),
}

/// Where the reference and the packer read coefficients from: a component's quantization table
/// and its block rows (natural order, 64 coefficients a block).
pub trait CoefficientSource {
    /// Component `component`'s quantization table, natural order.
    fn quant_table(&self, component: usize) -> Option<&[u16; 64]>;
    /// Block row `row` of `component`: its blocks one after the other, `None` if it was not
    /// read.
    fn block_row(&self, component: usize, row: u32) -> Option<&[i16]>;
}

impl CoefficientSource for Coefficients<'_> {
    fn quant_table(&self, component: usize) -> Option<&[u16; 64]> {
        Coefficients::quant_table(self, component)
    }

    fn block_row(&self, component: usize, row: u32) -> Option<&[i16]> {
        Coefficients::block_row(self, component, row).ok()
    }
}

/// Coefficients copied out of libjpeg's arrays: every block row read of every component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenseCoefficients {
    tables: Vec<[u16; 64]>,
    /// Per component: blocks per row and the rows, packed.
    planes: Vec<(usize, Vec<i16>)>,
}

impl DenseCoefficients {
    /// A copy of `coefficients`.
    pub fn copy(coefficients: &Coefficients<'_>) -> Result<DenseCoefficients, Error> {
        let header = coefficients.header();
        let mut tables = Vec::new();
        let mut planes = Vec::new();
        for (c, info) in header.components().iter().enumerate() {
            let table = coefficients
                .quant_table(c)
                .ok_or_else(|| Error::Request(format!("component {c}")))?;
            tables.push(*table);
            let row_len = info.blocks_wide as usize * 64;
            let mut plane = vec![0; row_len * coefficients.block_rows_read(c) as usize];
            coefficients.copy_component(c, &mut plane)?;
            planes.push((row_len, plane));
        }
        Ok(DenseCoefficients { tables, planes })
    }

    /// Coefficients from their parts: per component its table, its blocks per row and its rows
    /// packed (natural order).
    pub fn from_parts(
        tables: Vec<[u16; 64]>,
        planes: Vec<(usize, Vec<i16>)>,
    ) -> Result<DenseCoefficients, Error> {
        let consistent = tables.len() == planes.len()
            && planes
                .iter()
                .all(|(blocks, rows)| *blocks > 0 && rows.len() % (blocks * 64) == 0);
        if !consistent {
            return Err(Error::Request(
                "one table and whole block rows per component".into(),
            ));
        }
        let planes = planes
            .into_iter()
            .map(|(blocks, rows)| (blocks * 64, rows))
            .collect();
        Ok(DenseCoefficients { tables, planes })
    }
}

impl CoefficientSource for DenseCoefficients {
    fn quant_table(&self, component: usize) -> Option<&[u16; 64]> {
        self.tables.get(component)
    }

    fn block_row(&self, component: usize, row: u32) -> Option<&[i16]> {
        let (row_len, plane) = self.planes.get(component)?;
        plane.get(row as usize * row_len..(row as usize + 1) * row_len)
    }
}
