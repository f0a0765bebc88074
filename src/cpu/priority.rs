//! The CPU lane's threads yield to the GPU lane's.
//!
//! In hybrid decoding a few host threads keep the GPU busy: they read and plan the GPU lane's
//! files, stage them and call nvJPEG, and the batch thread uploads and launches the kernels. A
//! submitting thread hands the JPEG engines 15-20 images in the time a CPU lane thread decodes
//! one; when the CPU lane's threads hold every core, the GPU lane's wait for one and the engines
//! idle. So the CPU lane's threads run at a lower scheduling priority (a higher niceness, per
//! thread: the pipeline's other threads and the rest of the process keep theirs): they take
//! every core the GPU lane's threads leave and give one back as soon as one of those wakes.

use crate::schedule::ThreadPriority;

/// Sets the calling thread's priority as `priority` says. Where it cannot be lowered, the
/// thread keeps its priority: slower beside the GPU lane, never wrong.
pub(crate) fn apply(priority: ThreadPriority) {
    if priority == ThreadPriority::BelowTheGpuLane {
        lower_this_thread().ok();
    }
}

/// How much nicer than the thread that starts them the CPU lane's threads run beside a GPU lane
/// (Linux's scale: 0 normal, 19 the lowest; 10 gives a thread about a tenth of the share of a
/// normal one when both want the same core).
pub(crate) const NICENESS_BESIDE_THE_GPU_LANE: i32 = 10;

/// Lowers the calling thread's priority by [`NICENESS_BESIDE_THE_GPU_LANE`] (to 19 at most), and
/// returns its niceness after. Only lowering: a process may always do that to its threads, so
/// it fails only where the system has no per-thread priorities.
#[cfg(target_os = "linux")]
pub(crate) fn lower_this_thread() -> std::io::Result<i32> {
    use rustix::process::{getpriority_process, setpriority_process};
    let thread = Some(rustix::thread::gettid());
    let now = getpriority_process(thread)?;
    let lowered = (now + NICENESS_BESIDE_THE_GPU_LANE).min(19);
    setpriority_process(thread, lowered)?;
    Ok(lowered)
}

/// Elsewhere threads keep the priority they start with.
#[cfg(not(target_os = "linux"))]
pub(crate) fn lower_this_thread() -> std::io::Result<i32> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "per-thread priorities are Linux's",
    ))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use rustix::process::getpriority_process;

    fn niceness() -> i32 {
        getpriority_process(Some(rustix::thread::gettid())).expect("this thread's priority")
    }

    #[test]
    fn lowering_a_thread_leaves_the_thread_that_started_it_as_it_was() {
        let before = niceness();
        let (lowered, read_back) = std::thread::spawn(|| {
            let start = niceness();
            let lowered = lower_this_thread().expect("lowered");
            assert_eq!(lowered, (start + NICENESS_BESIDE_THE_GPU_LANE).min(19));
            (lowered, niceness())
        })
        .join()
        .expect("the thread");
        assert_eq!(read_back, lowered);
        assert_eq!(niceness(), before, "only the lowered thread changed");
        if before + NICENESS_BESIDE_THE_GPU_LANE <= 19 {
            assert_eq!(lowered, before + NICENESS_BESIDE_THE_GPU_LANE);
        }
    }
}
