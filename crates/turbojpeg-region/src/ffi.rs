//! The functions and structures of `src/shim.c`, declared by hand: plain integers only, laid out
//! as the C structures (`layout_matches` compares their sizes with the compiler's).

use libc::{c_char, c_int, c_uchar, size_t};

/// Success.
pub const OK: c_int = 0;
/// libjpeg refused the data; the reader's message says why.
pub const ERROR: c_int = 1;
/// A JPEG the reader does not take; the message says why.
pub const UNSUPPORTED: c_int = 2;
/// A progressive JPEG with more scans than the limit.
pub const SCAN_LIMIT: c_int = 3;
/// A call out of order or with bad arguments.
pub const BAD_CALL: c_int = 4;

/// Components read at most.
pub const MAX_COMPONENTS: usize = 4;

/// libjpeg's `JMSG_LENGTH_MAX`: the room a message needs.
pub const MESSAGE_LENGTH: usize = 200;

/// `struct gf_reader`: opaque, made and freed by the shim.
#[repr(C)]
pub struct Reader {
    _opaque: [u8; 0],
}

/// `struct gf_component`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Component {
    pub id: i32,
    pub h_samp: i32,
    pub v_samp: i32,
    pub quant_tbl_no: i32,
    pub blocks_wide: u32,
    pub blocks_high: u32,
    pub padded_blocks_wide: u32,
    pub padded_blocks_high: u32,
    pub samples_wide: u32,
    pub samples_high: u32,
}

/// `struct gf_header`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Header {
    pub width: u32,
    pub height: u32,
    pub num_components: i32,
    pub color_space: i32,
    pub data_precision: i32,
    pub progressive: i32,
    pub arithmetic: i32,
    pub restart_interval: i32,
    pub saw_jfif: i32,
    pub saw_adobe: i32,
    pub adobe_transform: i32,
    pub ccir601: i32,
    pub max_h_samp: i32,
    pub max_v_samp: i32,
    pub imcu_rows: u32,
    pub single_scan: i32,
    pub comp: [Component; MAX_COMPONENTS],
}

/// `struct gf_coefficients`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Coefficients {
    pub imcu_rows_read: u32,
    pub stopped_early: i32,
    pub block_smoothing: i32,
    pub warnings: i32,
    pub quant: [[u16; 64]; MAX_COMPONENTS],
}

impl Default for Coefficients {
    fn default() -> Coefficients {
        Coefficients {
            imcu_rows_read: 0,
            stopped_early: 0,
            block_smoothing: 0,
            warnings: 0,
            quant: [[0; 64]; MAX_COMPONENTS],
        }
    }
}

/// `struct gf_encode`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Encode {
    pub width: u32,
    pub height: u32,
    pub input_components: i32,
    pub jpeg_color_space: i32,
    pub quality: i32,
    pub progressive: i32,
    pub arithmetic: i32,
    pub optimize: i32,
    pub restart_interval: i32,
    pub restart_rows: i32,
    pub h_samp: [i32; MAX_COMPONENTS],
    pub v_samp: [i32; MAX_COMPONENTS],
}

/// `gf_decompress`'s output formats.
pub const FORMAT_RGB: i32 = 0;
pub const FORMAT_GRAY: i32 = 1;
pub const FORMAT_CMYK: i32 = 2;

/// `struct gf_request`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct DecodeRequest {
    pub format: i32,
    pub denom: i32,
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
    pub fast_huffman: i32,
}

/// `struct gf_decompressed`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Decompressed {
    pub warnings: i32,
    pub premature_end: i32,
    pub fast_huffman: i32,
}

/// libjpeg's `J_COLOR_SPACE` values the shim passes.
pub const JCS_GRAYSCALE: i32 = 1;
pub const JCS_RGB: i32 = 2;
pub const JCS_YCBCR: i32 = 3;
pub const JCS_CMYK: i32 = 4;
pub const JCS_YCCK: i32 = 5;

extern "C" {
    pub fn gf_reader_new() -> *mut Reader;
    pub fn gf_reader_free(reader: *mut Reader);
    pub fn gf_reader_message(reader: *const Reader) -> *const c_char;
    pub fn gf_reader_set_scan_limit(reader: *mut Reader, scans: c_int);
    pub fn gf_reader_close(reader: *mut Reader);
    pub fn gf_open(
        reader: *mut Reader,
        data: *const c_uchar,
        len: size_t,
        out: *mut Header,
    ) -> c_int;
    pub fn gf_read_coefficients(
        reader: *mut Reader,
        stop_rows: u32,
        out: *mut Coefficients,
    ) -> c_int;
    pub fn gf_block_rows(
        reader: *mut Reader,
        component: c_int,
        first: u32,
        count: u32,
        rows: *mut *const i16,
    ) -> c_int;
    pub fn gf_decompress(
        reader: *mut Reader,
        data: *const c_uchar,
        len: size_t,
        request: *const DecodeRequest,
        dst: *mut c_uchar,
        pitch: size_t,
        out: *mut Decompressed,
    ) -> c_int;
    pub fn gf_compress(
        params: *const Encode,
        pixels: *const c_uchar,
        out: *mut *mut c_uchar,
        out_len: *mut size_t,
        message: *mut c_char,
    ) -> c_int;
    pub fn gf_free(buffer: *mut c_uchar);
    pub fn gf_layout(which: c_int) -> size_t;
}

/// Whether the structures above have the sizes the C compiler gave the shim's.
pub fn layout_matches() -> bool {
    // SAFETY: gf_layout only returns `sizeof` of the shim's structures.
    let size = |which| unsafe { gf_layout(which) };
    size(0) == std::mem::size_of::<Component>()
        && size(1) == std::mem::size_of::<Header>()
        && size(2) == std::mem::size_of::<Coefficients>()
        && size(3) == std::mem::size_of::<Encode>()
        && size(4) == std::mem::size_of::<DecodeRequest>()
        && size(5) == std::mem::size_of::<Decompressed>()
}
