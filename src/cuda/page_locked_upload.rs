//! Uploads of host data a call makes afresh (a batch's resize plan) through page-locked memory
//! kept from call to call ([`PageLockedUpload`]).
//!
//! A copy from ordinary (pageable) memory waits for the work queued on its stream before it
//! starts, and copies the bytes twice; from page-locked memory it is queued and the thread goes
//! on. A GPU lane's thread uploads its call's resize plan after queuing the call's decode, so the
//! pageable copy kept the thread waiting for its own decode.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, DriverError};

use crate::memory::PageLocked;

/// Page-locked host memory that a call's uploads go through, grown only when a call needs more,
/// and the event recorded after the last copy out of it: a call's uploads wait for the last
/// call's copies to have left the memory before writing it (done long since, as a rule).
///
/// ```text
/// upload.start(stream, bytes)?;          // waits for the last call's copies; grows if needed
/// upload.queue(stream, &plan.descriptors, &mut descriptors)?;
/// upload.queue(stream, &plan.coefficients, &mut coefficients)?;
/// ```
#[derive(Default)]
pub(crate) struct PageLockedUpload {
    memory: Option<PageLocked>,
    /// Bytes of the memory the current call has staged.
    used: usize,
    /// Bytes the current call may stage ([`PageLockedUpload::start`]).
    started: usize,
    /// Recorded after the last copy out of the memory.
    uploaded: Option<CudaEvent>,
}

impl PageLockedUpload {
    /// Starts a call's uploads of `bytes` in all: waits for the last call's copies to have left
    /// the memory, and grows it when it holds less.
    pub fn start(&mut self, stream: &Arc<CudaStream>, bytes: usize) -> Result<(), DriverError> {
        self.started = 0;
        self.used = 0;
        if let Some(event) = &self.uploaded {
            event.synchronize()?;
        }
        if self
            .memory
            .as_ref()
            .is_none_or(|m| m.as_slice().len() < bytes)
        {
            // Nothing reads the old memory any more (waited above). A quarter more than asked,
            // so that calls a little larger each time do not lock memory again each time.
            self.memory = None;
            let room = bytes.saturating_add(bytes / 4);
            self.memory = Some(PageLocked::new(stream.context(), room)?);
        }
        self.started = bytes;
        Ok(())
    }

    /// Queues on `stream` the copy of `data` to the start of `destination`, through the next
    /// bytes of the memory the call started with. Refused (the driver's invalid value) when the
    /// call's bytes or the destination are too short for it.
    pub fn queue<T: DeviceRepr>(
        &mut self,
        stream: &Arc<CudaStream>,
        data: &[T],
        destination: &mut CudaSlice<T>,
    ) -> Result<(), DriverError> {
        let bytes = std::mem::size_of_val(data);
        let at = self.used;
        let fits = at.checked_add(bytes).is_some_and(|end| end <= self.started)
            && data.len() <= destination.len();
        let Some(memory) = self.memory.as_mut().filter(|_| fits) else {
            return Err(DriverError(
                cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            ));
        };
        if bytes == 0 {
            return Ok(());
        }
        let staged = &mut memory.as_mut_slice()[at..at + bytes];
        // SAFETY: `data` is `bytes` bytes of initialized values of a plain-old-data type (what
        // `DeviceRepr` promises), copied as bytes into `staged`, exactly `bytes` long, which is
        // this value's own memory and cannot overlap a borrowed slice.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr().cast::<u8>(), staged.as_mut_ptr(), bytes)
        };
        self.used = at + bytes;
        stream.context().bind_to_thread()?;
        let (address, _written) = destination.device_ptr_mut(stream);
        // SAFETY: the destination holds at least `data.len()` values (checked above), borrowed
        // while the copy is queued on `stream`, which orders every later use of it; the source
        // is page-locked memory this value owns, which is not written again before the event
        // recorded below is reached (`start` waits for it) nor freed before (the drop waits).
        unsafe { cudarc::driver::result::memcpy_htod_async(address, staged, stream.cu_stream()) }?;
        match &self.uploaded {
            Some(event) => event.record(stream)?,
            None => self.uploaded = Some(stream.record_event(None)?),
        }
        Ok(())
    }
}

impl Drop for PageLockedUpload {
    fn drop(&mut self) {
        // The memory is unlocked and freed after this: the copies out of it must be done. A
        // failed wait means the context is gone, and its copies with it.
        if let Some(event) = &self.uploaded {
            let _ = event.synchronize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uploads through the memory land as the data, call after call, the memory growing when a
    /// call needs more; a call past its started bytes or its destination is refused.
    #[test]
    fn uploads_land_as_the_data_and_overruns_are_refused() {
        let Some(gpu) = crate::cuda::test_gpu("uploads_land_as_the_data_and_overruns_are_refused")
        else {
            return;
        };
        let stream = gpu.stream();
        let mut upload = PageLockedUpload::default();
        let mut words = stream.clone_htod(&vec![-1i32; 3 << 20]).expect("words");
        let mut bytes = stream.clone_htod(&vec![0xA5u8; 100]).expect("bytes");
        for (round, len) in [(0i32, 1000usize), (1, 3 << 20), (2, 17)] {
            let data: Vec<i32> = (0..len as i32).map(|i| i * 7 + round).collect();
            let small: Vec<u8> = (0..100)
                .map(|i| (i as u8).wrapping_mul(3) ^ round as u8)
                .collect();
            upload.start(stream, len * 4 + 100).expect("start");
            upload.queue(stream, &data, &mut words).expect("words");
            upload.queue(stream, &small, &mut bytes).expect("bytes");
            let back = stream.clone_dtoh(&words).expect("read");
            assert_eq!(&back[..len], &data[..], "round {round}");
            assert_eq!(
                stream.clone_dtoh(&bytes).expect("read"),
                small,
                "round {round}"
            );
        }
        // Two calls queued back to back: the second waits for the first's copy before writing
        // the memory, so the first destination holds the first call's data.
        let first: Vec<i32> = (0..1 << 20).collect();
        let second: Vec<i32> = (0..1 << 20).map(|i| -i).collect();
        let mut other = stream.clone_htod(&vec![0i32; 1 << 20]).expect("other");
        upload.start(stream, 4 << 20).expect("start");
        upload.queue(stream, &first, &mut words).expect("first");
        upload.start(stream, 4 << 20).expect("start");
        upload.queue(stream, &second, &mut other).expect("second");
        assert_eq!(
            &stream.clone_dtoh(&words).expect("read")[..1 << 20],
            &first[..]
        );
        assert_eq!(stream.clone_dtoh(&other).expect("read"), second);
        upload.start(stream, 8).expect("start");
        assert!(upload.queue(stream, &[1i32, 2, 3], &mut words).is_err());
        upload.start(stream, 1 << 10).expect("start");
        assert!(upload.queue(stream, &[0u8; 101], &mut bytes).is_err());
    }
}
