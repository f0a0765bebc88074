//! The JPEGs of the batches made for a CUDA device decoded on the device's cores: each baseline
//! JPEG is parsed on the pool thread that loads its row ([`DeviceJpeg::take`]: its
//! entropy-coded data destuffed, its layout read by libjpeg-turbo), and when its batch is laid
//! out the batch's JPEGs go to one of a few [`GpuDecoder`]s (`kernels/entropy.cu`,
//! `kernels/idct.cu`: Huffman decoding, libjpeg-turbo's integer inverse DCT, upsampling and
//! colour conversion, the bytes libjpeg-turbo makes), whose output is copied into a device
//! buffer of the batch ([`DecodedImages`]) where the resize kernel reads it. Only the
//! compressed bytes cross PCIe. A file the decoders do not take, or whose decode they find
//! corrupt, is decoded on the CPU as before, with the same bytes.
//!
//! The decoders open on a thread of their own beside the first batches (their buffers take a
//! few tenths of a second), and until one is open the rows are decoded on the CPU.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use turbojpeg_region::CoefficientReader;

use crate::coefficients::entropy::{self, ParsedJpeg};
use crate::coefficients::gpu::{Budget, GpuDecoder};
use crate::coefficients::{Layout, Window};
use crate::cuda::resize::PackedPixels;
use crate::error::{Error, Result};
use crate::options::DecodeOptions;

/// Decoders the pool threads share: a batch's call holds one while its entropy decode runs
/// (the thread waits for its verdicts), so a few let the threads laying out other batches go
/// on.
const DECODERS: usize = 4;

/// Pixels one call of a decoder holds (its buffers: about 300 MB of device memory and 32 MB
/// page-locked a decoder); a larger batch is decoded in several calls, and an image larger alone
/// on the CPU.
const CALL_PIXELS: u64 = 16 << 20;

/// Images one call holds at most.
const CALL_IMAGES: usize = 64;

/// A baseline JPEG left for the device to decode: its bytes (for the CPU, should the device
/// not take it after all) and what the device's decoder needs.
pub(crate) struct DeviceJpeg {
    bytes: Vec<u8>,
    parsed: ParsedJpeg,
    layout: Layout,
}

impl std::fmt::Debug for DeviceJpeg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceJpeg")
            .field("width", &self.layout.width)
            .field("height", &self.layout.height)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

thread_local! {
    /// This thread's libjpeg-turbo header reader, made on first use.
    static HEADERS: RefCell<Option<CoefficientReader>> = const { RefCell::new(None) };
}

impl DeviceJpeg {
    /// `bytes` parsed for the device's decoder when they are a baseline JPEG it decodes as
    /// libjpeg-turbo does (gray, YCbCr or RGB, within `options`' pixel limit and a call's, not
    /// one an EXIF tag turns when `options` turn them); else the bytes back, for the CPU.
    pub(crate) fn take(
        bytes: Vec<u8>,
        options: &DecodeOptions,
    ) -> std::result::Result<DeviceJpeg, Vec<u8>> {
        match parse(&bytes, options) {
            Some((parsed, layout)) => Ok(DeviceJpeg {
                bytes,
                parsed,
                layout,
            }),
            None => Err(bytes),
        }
    }

    /// Columns.
    pub(crate) fn width(&self) -> u32 {
        self.layout.width
    }

    /// Rows.
    pub(crate) fn height(&self) -> u32 {
        self.layout.height
    }

    /// The file's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

fn parse(bytes: &[u8], options: &DecodeOptions) -> Option<(ParsedJpeg, Layout)> {
    if !bytes.starts_with(&[0xFF, 0xD8]) || (options.exif_orientation && may_turn(bytes)) {
        return None;
    }
    let parsed = entropy::parse(bytes).ok()?;
    let pixels = u64::from(parsed.width) * u64::from(parsed.height);
    // Over the limit the CPU refuses the file and says why.
    if pixels == 0 || pixels > options.max_pixels.min(CALL_PIXELS) {
        return None;
    }
    let layout = HEADERS.with_borrow_mut(|reader| {
        let reader = match reader {
            Some(reader) => reader,
            None => reader.insert(CoefficientReader::new().ok()?),
        };
        Layout::new(reader.open(bytes).ok()?.header()).ok()
    })?;
    (layout.width == parsed.width && layout.height == parsed.height).then_some((parsed, layout))
}

/// Whether the JPEG `bytes` has an EXIF segment before its first scan (or markers this walk
/// cannot follow): the CPU, which turns the image by its orientation tag, then decodes it.
fn may_turn(bytes: &[u8]) -> bool {
    let mut at = 2;
    while let Some(&[0xFF, marker]) = bytes.get(at..at + 2) {
        match marker {
            0xFF => at += 1,
            0xDA | 0xD9 => return false,
            0x01 | 0xD0..=0xD7 => at += 2,
            _ => {
                let Some(&[hi, lo]) = bytes.get(at + 2..at + 4) else {
                    return true;
                };
                if marker == 0xE1 && bytes.get(at + 4..at + 9) == Some(b"Exif\0") {
                    return true;
                }
                at += 2 + usize::from(u16::from_be_bytes([hi, lo]));
            }
        }
    }
    true
}

/// The images of one batch decoded on the device, one after another (rows as the decoder
/// rendered them), read by the batch's resize; reused from batch to batch.
pub(crate) struct DecodedImages {
    buffer: Option<CudaSlice<u8>>,
    len: usize,
    /// Recorded on the decoding stream after the last copy into it.
    written: Option<CudaEvent>,
    /// Recorded on the loader's stream after the last work reading it.
    read: Option<CudaEvent>,
}

impl std::fmt::Debug for DecodedImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodedImages")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl DecodedImages {
    /// The buffer the rows' [`PackedPixels::Decoded`] offsets are in.
    pub(crate) fn buffer(&self) -> Option<&CudaSlice<u8>> {
        self.buffer.as_ref()
    }

    /// Makes `stream` wait for the copies into the buffer.
    pub(crate) fn wait_on(&self, stream: &Arc<CudaStream>) -> Result<()> {
        match &self.written {
            Some(event) => stream
                .wait(event)
                .map_err(|e| Error::cuda("waiting for the images decoded on the device", e)),
            None => Ok(()),
        }
    }

    /// Records that the work queued on `stream` so far is the last to read the buffer.
    pub(crate) fn read_on(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let event = stream
            .record_event(None)
            .map_err(|e| Error::cuda("recording a read of the decoded images", e))?;
        self.read = Some(event);
        Ok(())
    }

    /// Waits until nothing reads the buffer any more.
    fn wait_read(&self) -> Result<()> {
        match &self.read {
            Some(event) => event
                .synchronize()
                .map_err(|e| Error::cuda("waiting for a read of the decoded images", e)),
            None => Ok(()),
        }
    }

    /// Copies `range` of `output` (on `stream`) after the images held: where it starts in the
    /// buffer. The buffer grows (its images copied along) when they do not fit.
    fn append(
        &mut self,
        stream: &Arc<CudaStream>,
        output: &CudaSlice<u8>,
        range: std::ops::Range<usize>,
    ) -> Result<usize> {
        let fail = |e| Error::cuda("copying the images decoded on the device", e);
        let (at, end) = (self.len, self.len + range.len());
        if self.buffer.as_ref().is_none_or(|b| b.len() < end) {
            let mut grown = stream
                .alloc_zeros::<u8>(end.max(1).next_power_of_two())
                .map_err(|e| Error::cuda("allocating the decoded images' buffer", e))?;
            if let Some(old) = &self.buffer {
                if at > 0 {
                    stream
                        .memcpy_dtod(&old.slice(..at), &mut grown.slice_mut(..at))
                        .map_err(fail)?;
                }
            }
            self.buffer = Some(grown);
        }
        if let Some(buffer) = self.buffer.as_mut() {
            stream
                .memcpy_dtod(&output.slice(range), &mut buffer.slice_mut(at..end))
                .map_err(fail)?;
        }
        self.len = end;
        Ok(at)
    }
}

impl Drop for DecodedImages {
    fn drop(&mut self) {
        // Device memory must outlive any resize still reading it.
        let _ = self.wait_read();
    }
}

/// The device's JPEG decoders and the buffers of decoded images, shared by the pool threads.
pub(crate) struct JpegDecoders {
    free: Mutex<Vec<GpuDecoder>>,
    returned: Condvar,
    /// Decoders made so far.
    open: AtomicUsize,
    /// Why none could be made, once known.
    failed: Mutex<Option<String>>,
    buffers: Mutex<Vec<DecodedImages>>,
}

impl std::fmt::Debug for JpegDecoders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JpegDecoders")
            .field("open", &self.open.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl JpegDecoders {
    /// Opens the decoders on `stream`'s device, each on a stream of its own: on a thread of
    /// their own (the rows decoded on the CPU until the first is made), or now with `wait`.
    pub(crate) fn open(stream: &Arc<CudaStream>, wait: bool) -> Arc<JpegDecoders> {
        let decoders = Arc::new(JpegDecoders {
            free: Mutex::new(Vec::with_capacity(DECODERS)),
            returned: Condvar::new(),
            open: AtomicUsize::new(0),
            failed: Mutex::new(None),
            buffers: Mutex::new(Vec::new()),
        });
        let context = stream.context().clone();
        let opening = Arc::downgrade(&decoders);
        let make = move || {
            for _ in 0..DECODERS {
                // Dropped before it is made: nothing more to make.
                let Some(decoders) = opening.upgrade() else {
                    return;
                };
                let budget = Budget::for_megapixels(CALL_PIXELS as f64 / 1e6, CALL_IMAGES);
                let made = context
                    .new_stream()
                    .map_err(|e| e.to_string())
                    .and_then(|stream| GpuDecoder::new(&stream, budget).map_err(|e| e.to_string()));
                match made {
                    Ok(decoder) => decoders.add(decoder),
                    Err(reason) => {
                        lock(&decoders.failed).get_or_insert(reason);
                        decoders.returned.notify_all();
                        return;
                    }
                }
            }
        };
        match wait {
            true => make(),
            false => {
                let _ = std::thread::Builder::new()
                    .name("gpufeed-jpeg-decoders".into())
                    .spawn(make);
            }
        }
        decoders
    }

    fn add(&self, decoder: GpuDecoder) {
        lock(&self.free).push(decoder);
        self.open.fetch_add(1, Ordering::Release);
        self.returned.notify_one();
    }

    /// Whether a decoder is open: the rows loaded from now on leave their JPEGs to the device.
    pub(crate) fn taking(&self) -> bool {
        self.open.load(Ordering::Acquire) > 0
    }

    /// What decodes the JPEGs, in words.
    pub(crate) fn describe(&self) -> String {
        let open = self.open.load(Ordering::Acquire);
        match (open, lock(&self.failed).as_ref()) {
            (0, Some(reason)) => {
                format!("the CPU threads (the device's JPEG decoders could not open: {reason})")
            }
            (0, None) => "the CPU threads (the device's JPEG decoders opening)".into(),
            (n, _) => format!(
                "the device's cores for baseline JPEGs ({n} decoders), the CPU threads for the rest"
            ),
        }
    }

    /// A free decoder, waiting for one while all are in use; `None` when none is open.
    fn take_decoder(&self) -> Option<Lent<'_>> {
        let mut free = lock(&self.free);
        loop {
            if let Some(decoder) = free.pop() {
                return Some(Lent {
                    decoders: self,
                    decoder: Some(decoder),
                });
            }
            if !self.taking() {
                return None;
            }
            free = self.returned.wait(free).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A buffer of decoded images, empty, its last reader done.
    fn take_buffer(&self) -> Result<DecodedImages> {
        let images = lock(&self.buffers).pop();
        match images {
            Some(mut images) => {
                images.wait_read()?;
                images.len = 0;
                images.written = None;
                Ok(images)
            }
            None => Ok(DecodedImages {
                buffer: None,
                len: 0,
                written: None,
                read: None,
            }),
        }
    }

    /// Keeps `images` for the next batches unless `keep` are kept already.
    pub(crate) fn give_buffer(&self, images: DecodedImages, keep: usize) {
        let mut buffers = lock(&self.buffers);
        if buffers.len() < keep {
            buffers.push(images);
        }
    }

    /// Decodes `jpegs` on the device into a buffer of decoded images: where each one's pixels
    /// are, `None` for those it did not decode (over a call's buffers alone, or found corrupt:
    /// the CPU decodes those). Nothing is decoded when no decoder is open or the device fails.
    pub(crate) fn decode(
        &self,
        jpegs: &[&DeviceJpeg],
    ) -> (Option<DecodedImages>, Vec<Option<PackedPixels>>) {
        let mut placed = vec![None; jpegs.len()];
        if jpegs.is_empty() {
            return (None, placed);
        }
        let Some(mut lent) = self.take_decoder() else {
            return (None, placed);
        };
        let Some(decoder) = lent.decoder.as_mut() else {
            return (None, placed);
        };
        let decoded = self
            .take_buffer()
            .and_then(|mut images| {
                decode_calls(decoder, jpegs, &mut images, &mut placed)?;
                Ok(images)
            })
            .inspect_err(|_| {
                // Whatever was queued is done before the decoder and buffers are used again.
                let _ = decoder.stream().synchronize();
            });
        drop(lent);
        match decoded {
            Ok(images) if placed.iter().any(Option::is_some) => (Some(images), placed),
            Ok(images) => {
                self.give_buffer(images, DECODERS);
                (None, vec![None; jpegs.len()])
            }
            Err(_) => (None, vec![None; jpegs.len()]),
        }
    }
}

/// A decoder taken from the free ones, given back when dropped; one dropped by a panic is not
/// given back (its state unknown) and no longer counted open, so no thread waits for it.
struct Lent<'a> {
    decoders: &'a JpegDecoders,
    decoder: Option<GpuDecoder>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        let Some(decoder) = self.decoder.take() else {
            return;
        };
        let decoders = self.decoders;
        if std::thread::panicking() {
            drop(decoder);
            decoders.open.fetch_sub(1, Ordering::AcqRel);
            decoders.returned.notify_all();
            return;
        }
        lock(&decoders.free).push(decoder);
        decoders.returned.notify_one();
    }
}

/// Decodes `jpegs` in as few calls of `decoder` as its buffers allow, each call's rendered
/// images copied into `images`; `placed[k]` says where image `k` went.
fn decode_calls(
    decoder: &mut GpuDecoder,
    jpegs: &[&DeviceJpeg],
    images: &mut DecodedImages,
    placed: &mut [Option<PackedPixels>],
) -> Result<()> {
    let failed = |e: crate::coefficients::Error| Error::Mismatch(e.to_string());
    let mut next = 0;
    let mut added: Vec<(usize, usize)> = Vec::with_capacity(jpegs.len());
    while next < jpegs.len() {
        decoder.clear();
        added.clear();
        while let Some(jpeg) = jpegs.get(next) {
            let window = Window::whole(jpeg.layout.width, jpeg.layout.height);
            if !decoder.fits_entropy_coded(&jpeg.parsed, &jpeg.layout, &window) {
                if added.is_empty() {
                    // Too large for a call alone: the CPU decodes it.
                    next += 1;
                    continue;
                }
                break;
            }
            if let Ok(at) = decoder.add_entropy_coded(&jpeg.parsed, &jpeg.layout, &window) {
                added.push((next, at));
            }
            next += 1;
        }
        if added.is_empty() {
            continue;
        }
        decoder.upload().map_err(failed)?;
        decoder.transform().map_err(failed)?;
        let corrupt = decoder.entropy_failures().map_err(failed)?;
        let rendered = decoder.rendered();
        let good: Vec<(usize, crate::coefficients::batch::Rendered)> = added
            .iter()
            .filter(|(_, at)| !corrupt.iter().any(|(bad, _)| bad == at))
            .filter_map(|&(k, at)| Some((k, *rendered.get(at)?)))
            .collect();
        let extent = |r: &crate::coefficients::batch::Rendered| {
            let row = r.width as usize * r.channels as usize;
            r.offset as usize + r.pitch as usize * (r.height as usize).saturating_sub(1) + row
        };
        let (Some(start), Some(end)) = (
            good.iter().map(|(_, r)| r.offset as usize).min(),
            good.iter().map(|(_, r)| extent(r)).max(),
        ) else {
            continue;
        };
        let stream = decoder.stream().clone();
        let at = images.append(&stream, decoder.output(), start..end)?;
        for (k, r) in good {
            placed[k] = Some(PackedPixels::Decoded {
                offset: at + (r.offset as usize - start),
                pitch: r.pitch,
                gray: r.channels == 1,
            });
        }
        let recorded = match &images.written {
            Some(event) => event.record(&stream),
            None => stream.record_event(None).map(|event| {
                images.written = Some(event);
            }),
        };
        recorded.map_err(|e| Error::cuda("recording the decoded images' copy", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jpeg(width: u32, height: u32) -> Vec<u8> {
        let rgb = image::RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([(x * 3) as u8, (y * 5) as u8, (x ^ y) as u8])
        });
        let mut bytes = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 90)
            .encode_image(&rgb)
            .expect("encode");
        bytes
    }

    /// `bytes` with an APP1 Exif segment after SOI.
    fn with_exif(bytes: &[u8]) -> Vec<u8> {
        let payload = b"Exif\0\0MM\0*\0\0\0\x08\0\0";
        let len = (payload.len() + 2) as u16;
        let mut out = bytes[..2].to_vec();
        out.extend([0xFF, 0xE1]);
        out.extend(len.to_be_bytes());
        out.extend(payload);
        out.extend(&bytes[2..]);
        out
    }

    #[test]
    fn baseline_jpegs_are_left_to_the_device_others_to_the_cpu() {
        let options = DecodeOptions::default();
        let file = jpeg(40, 24);
        let taken = DeviceJpeg::take(file.clone(), &options).expect("a baseline JPEG");
        assert_eq!((taken.width(), taken.height()), (40, 24));
        assert_eq!(taken.bytes(), &file[..]);
        // Not a JPEG, a cut header, no pixels allowed: the bytes come back, unchanged.
        let png = b"\x89PNG\r\n\x1a\n rest".to_vec();
        assert_eq!(DeviceJpeg::take(png.clone(), &options).unwrap_err(), png);
        let cut = file[..20].to_vec();
        assert_eq!(DeviceJpeg::take(cut.clone(), &options).unwrap_err(), cut);
        let small = DecodeOptions {
            max_pixels: 40 * 24 - 1,
            ..options
        };
        assert!(DeviceJpeg::take(file.clone(), &small).is_err());
        // An EXIF segment keeps a file on the CPU only when orientation is applied.
        let exif = with_exif(&file);
        assert!(DeviceJpeg::take(exif.clone(), &options).is_ok());
        let turning = options.exif_orientation(true);
        assert!(DeviceJpeg::take(exif, &turning).is_err());
        assert!(DeviceJpeg::take(file, &turning).is_ok());
    }

    #[test]
    fn the_marker_walk_stops_at_the_scan_and_distrusts_what_it_cannot_follow() {
        let file = jpeg(16, 16);
        assert!(!may_turn(&file));
        assert!(may_turn(&with_exif(&file)));
        // A length running past the end, a byte that is no marker.
        assert!(may_turn(&[0xFF, 0xD8, 0xFF, 0xE0, 0x40, 0x00]));
        assert!(may_turn(&[0xFF, 0xD8, 0x12, 0x34]));
        // Fill bytes before a marker are skipped.
        assert!(!may_turn(&[0xFF, 0xD8, 0xFF, 0xFF, 0xDA, 0x00]));
    }
}
