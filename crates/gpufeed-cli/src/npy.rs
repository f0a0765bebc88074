//! A streaming `.npy` writer: rows are appended as batches arrive, and the header, written with
//! room to spare, is rewritten with the final row count at the end. Rows are images (`[C, H, W]`
//! or `[H, W, C]`), a patch sequence's tokens (`[patch_dim]`), or the values of its side tensors
//! (`[]`, `[2]`, `[3]`), in `f16`, `bf16` (its raw bits), `f32`, `i32` or `i64`.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use gpufeed::{DType, HostTensor};

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// Fixed header length (magic, version, length field and the padded dict), a multiple of 64.
const HEADER_LEN: usize = 128;

/// An integer type a side tensor is written in, with its NumPy type string.
pub trait LittleEndian: Copy {
    /// NumPy's type string.
    const DESCR: &'static str;
    /// The value's bytes, little-endian.
    fn le_bytes(self) -> Vec<u8>;
}

impl LittleEndian for i32 {
    const DESCR: &'static str = "<i4";
    fn le_bytes(self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
}

impl LittleEndian for i64 {
    const DESCR: &'static str = "<i8";
    fn le_bytes(self) -> Vec<u8> {
        self.to_le_bytes().to_vec()
    }
}

/// An `.npy` file written a batch at a time.
pub struct NpyWriter {
    file: BufWriter<File>,
    path: PathBuf,
    descr: &'static str,
    row_shape: Option<Vec<usize>>,
    rows: usize,
    /// Rows of shape [C, 1, 1] are written as a matrix [N, C].
    matrix: bool,
}

fn write_error(path: &Path, e: impl std::fmt::Display) -> Box<dyn std::error::Error> {
    format!("cannot write {}: {e}", path.display()).into()
}

/// numpy's type string; bf16 has none, so its raw bits are stored as little-endian u16.
fn descr(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F16 => Ok("<f2"),
        DType::BF16 => Ok("<u2"),
        DType::F32 => Ok("<f4"),
        DType::I32 => Ok("<i4"),
        DType::I64 => Ok("<i8"),
        DType::U8 => Ok("|u1"),
        other => Err(format!("no .npy type for {other}").into()),
    }
}

impl NpyWriter {
    /// A writer of rows of `dtype` at `path`.
    pub fn create(path: &Path, dtype: DType) -> Result<NpyWriter> {
        NpyWriter::open(path, dtype, false)
    }

    /// A writer of `f32` rows of shape `[C, 1, 1]` (soft labels) as a matrix `[N, C]`.
    pub fn create_matrix(path: &Path) -> Result<NpyWriter> {
        NpyWriter::open(path, DType::F32, true)
    }

    fn open(path: &Path, dtype: DType, matrix: bool) -> Result<NpyWriter> {
        let file = File::create(path).map_err(|e| write_error(path, e))?;
        let mut writer = NpyWriter {
            file: BufWriter::with_capacity(1 << 22, file),
            path: path.to_path_buf(),
            descr: descr(dtype)?,
            row_shape: None,
            rows: 0,
            matrix,
        };
        writer.write_header()?;
        Ok(writer)
    }

    fn header(&self) -> Vec<u8> {
        let shape = match self.row_shape.as_deref() {
            // Rows of one value a class (soft labels, [N, C, 1, 1] as the batch holds them):
            // a matrix [N, C].
            Some(&[a, 1, 1]) if self.descr == "<f4" && self.matrix => {
                format!("({}, {a})", self.rows)
            }
            Some(row) => {
                let mut axes = vec![self.rows.to_string()];
                axes.extend(row.iter().map(usize::to_string));
                match axes.len() {
                    1 => format!("({},)", axes[0]),
                    _ => format!("({})", axes.join(", ")),
                }
            }
            None => "(0,)".to_string(),
        };
        let dict = format!(
            "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
            self.descr
        );
        let mut header = b"\x93NUMPY\x01\x00".to_vec();
        header.extend_from_slice(&((HEADER_LEN - 10) as u16).to_le_bytes());
        header.extend_from_slice(dict.as_bytes());
        header.resize(HEADER_LEN - 1, b' ');
        header.push(b'\n');
        header
    }

    fn write_header(&mut self) -> Result<()> {
        let header = self.header();
        self.file
            .write_all(&header)
            .map_err(|e| write_error(&self.path, e))
    }

    /// Appends the rows (images) of `tensor`.
    pub fn append(&mut self, tensor: &HostTensor) -> Result<()> {
        let &[n, a, b, c] = tensor.shape() else {
            return Err(write_error(
                &self.path,
                format!(
                    "a tensor of shape {:?} is not a batch of images",
                    tensor.shape()
                ),
            ));
        };
        self.append_bytes(&tensor.to_le_bytes(), n, &[a, b, c])
    }

    /// Appends `tensor` as rows of its last axis: `[rows, patch_dim]` or `[images, length,
    /// patch_dim]` tokens both as rows of `[patch_dim]`.
    pub fn append_vectors(&mut self, tensor: &HostTensor) -> Result<()> {
        let Some((&last, outer)) = tensor.shape().split_last() else {
            return Err(write_error(&self.path, "a tensor without axes"));
        };
        let rows = outer.iter().product();
        self.append_bytes(&tensor.to_le_bytes(), rows, &[last])
    }

    /// Appends `values` (of the writer's type, little-endian) as rows of `row_shape`.
    pub fn append_values<T: LittleEndian>(
        &mut self,
        values: &[T],
        row_shape: &[usize],
    ) -> Result<()> {
        let per_row: usize = row_shape.iter().product();
        if T::DESCR != self.descr || per_row == 0 || !values.len().is_multiple_of(per_row) {
            return Err(write_error(
                &self.path,
                format!(
                    "{} values of {} are not rows of {row_shape:?} of {}",
                    values.len(),
                    T::DESCR,
                    self.descr
                ),
            ));
        }
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.le_bytes()).collect();
        self.append_bytes(&bytes, values.len() / per_row, row_shape)
    }

    /// Appends `rows` rows of `row_shape` held in `bytes`.
    fn append_bytes(&mut self, bytes: &[u8], rows: usize, row_shape: &[usize]) -> Result<()> {
        match &self.row_shape {
            None => self.row_shape = Some(row_shape.to_vec()),
            Some(shape) if shape == row_shape => {}
            Some(shape) => {
                return Err(write_error(
                    &self.path,
                    format!("rows of shape {row_shape:?} after rows of {shape:?}"),
                ))
            }
        }
        self.file
            .write_all(bytes)
            .map_err(|e| write_error(&self.path, e))?;
        self.rows += rows;
        Ok(())
    }

    /// Rewrites the header with the final shape and closes the file.
    pub fn finish(mut self) -> Result<()> {
        let header = self.header();
        if header.len() != HEADER_LEN {
            return Err(write_error(&self.path, "header too long"));
        }
        let path = self.path.clone();
        self.file.flush().map_err(|e| write_error(&path, e))?;
        let file = self.file.get_mut();
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.write_all(&header))
            .and_then(|_| file.sync_all())
            .map_err(|e| write_error(&path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_of(path: &Path) -> String {
        let bytes = std::fs::read(path).expect("written");
        String::from_utf8_lossy(&bytes[10..HEADER_LEN])
            .trim_end()
            .to_string()
    }

    /// Side tensors of one value a row are 1-D (`(N,)`, as NumPy writes it), of pairs 2-D; a
    /// value of another type, or a row of another shape, is refused.
    #[test]
    fn rows_of_any_rank_and_integer_types() {
        let dir = std::env::temp_dir().join(format!("gpufeed-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let offsets = dir.join("offsets.npy");
        let mut writer = NpyWriter::create(&offsets, DType::I64).expect("create");
        writer.append_values::<i64>(&[0], &[]).expect("first");
        writer.append_values::<i64>(&[5, 9], &[]).expect("more");
        assert!(writer.append_values::<i32>(&[1], &[]).is_err());
        assert!(writer.append_values::<i64>(&[1, 2], &[2]).is_err());
        writer.finish().expect("finish");
        assert!(header_of(&offsets).contains("'descr': '<i8'"));
        assert!(header_of(&offsets).contains("'shape': (3,)"));
        let bytes = std::fs::read(&offsets).expect("read");
        assert_eq!(bytes.len(), HEADER_LEN + 3 * 8);
        assert_eq!(bytes[HEADER_LEN + 8], 5);
        let pairs = dir.join("pairs.npy");
        let mut writer = NpyWriter::create(&pairs, DType::I32).expect("create");
        writer
            .append_values::<i32>(&[1, 2, 3, 4], &[2])
            .expect("pairs");
        writer.finish().expect("finish");
        assert!(header_of(&pairs).contains("'shape': (2, 2)"));
        std::fs::remove_dir_all(&dir).expect("clean");
    }
}
