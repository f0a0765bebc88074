//! How many of the CPU lane's threads work beside a GPU lane, and at what priority: the CPU lane
//! leaves the GPU lane's host threads the cores they keep busy, and its threads yield to theirs
//! (a higher niceness; the CPU lane carries it out).

/// Cores the CPU lane leaves to the GPU lane's host threads (its submitting threads wait on the
/// engines most of the time) and the thread that hands the batches out, when the thread count is
/// left to the pipeline.
pub(crate) const CORES_FOR_THE_GPU_LANE: usize = 2;

/// The GPU lane's host threads: its preparing threads, its assisted path's submitting threads
/// and its engines' (the GPU lane checks at build time that its own counts add up to this).
pub(crate) const GPU_LANE_HOST_THREADS: usize = 11;

/// Preparing threads the GPU lane adds in a pipeline of views, where it plans about ten resizes
/// an image on the host (about 150 µs an image for DINOv2's, against 35 µs for one crop): eight
/// in all. Measured on the H200 machine (16 cores, 8,192 ImageNet-sized files, `dinov2`), when
/// the lane had 3 of its own: from process start over 5 epochs, in turn on one start, 6,471
/// images/s with the lane's 3 (the GPU's cores 60% busy) and 15,895 with 3 more (89% busy);
/// `cargo bench --bench views`, in turn on a later start, two rounds: 3 more 15,023 and 15,032,
/// 5 more 16,573 and 16,184; on another, 5 more 14,774 and 15,798, 7 more 14,622 and 15,956
/// (the GPU's cores, not the planning, then set the pace).
pub(crate) const VIEWS_EXTRA_PREPARING_THREADS: usize = 3;

/// The CPU lane's threads that work beside a lane of views, at least: they make the views of the
/// files the GPU lane refuses (CMYK JPEGs, other formats), about 4 ms an image for DINOv2's ten,
/// at a priority below the lane's fifteen busy host threads. Measured on the H200 machine (16
/// cores, 8,192 ImageNet-sized files, 1% of them CMYK, `dinov2`, 8 epochs from process start, in
/// turn on one start, three rounds): with the one thread the lane's part of the cores left,
/// 14,785 / 14,732 / 13,903 images/s, the batches waiting 1.6-1.8 s for the CPU lane; with 4,
/// 16,961 / 16,414 / 16,920, waiting 0.4 s.
pub(crate) const VIEWS_CPU_THREADS_BESIDE: usize = 4;

/// The scheduling priority a lane's threads run at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ThreadPriority {
    /// That of the thread that starts them.
    Inherited,
    /// Below the GPU lane's threads: a higher niceness, set by each thread as it starts.
    BelowTheGpuLane,
}

/// The cores a GPU lane's host threads and the thread that puts the batches together need when
/// the lane decodes every image. Beside a GPU lane decoding most images, CPU threads on the cores
/// its host threads wait on slow it more than they add: on the H200 machine (16 cores, 8,192
/// ImageNet-sized files, the assisted path taking three in four small files, the share
/// following the rates, in turn on one start) 33,000 images/s with 4 CPU threads, 33,600-35,100
/// with 6, 32,900-33,200 with 8, and 30,600-31,500 with the cores its host threads kept busy
/// left to them (about 10 threads); the GPU lane alone 36,000-36,900. `lane_threads`: the
/// lane's host threads.
fn gpu_lane_cores(lane_threads: usize) -> usize {
    lane_threads + 1
}

/// The CPU threads to keep working beside a GPU lane of `lane_threads` host threads which keep
/// `gpu_cores` cores busy and which decodes `gpu_fraction` of the images (0 where the share is
/// given: the CPU lane then keeps the threads its part needs), on `cores` cores: the rest of
/// the cores busy or the lane's part of [`gpu_lane_cores`], whichever is more, at least `least`
/// (and one) and at most `threads`.
pub(crate) fn cpu_threads_beside(
    cores: usize,
    (gpu_cores, gpu_fraction): (f64, f64),
    threads: usize,
    (lane_threads, least): (usize, usize),
) -> usize {
    let busy = gpu_cores.max(0.0);
    let part = gpu_lane_cores(lane_threads) as f64 * gpu_fraction.clamp(0.0, 1.0);
    let taken = busy.max(part).round() as usize;
    cores
        .saturating_sub(taken)
        .max(least)
        .clamp(1, threads.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane's host threads for single images.
    const LANE: usize = GPU_LANE_HOST_THREADS;

    #[test]
    fn the_cpu_lane_leaves_the_gpu_lane_the_cores_it_keeps_busy_or_its_part_of_them() {
        // A given share: the cores the lane kept busy.
        assert_eq!(cpu_threads_beside(16, (5.2, 0.0), 16, (LANE, 1)), 11);
        assert_eq!(cpu_threads_beside(16, (6.6, 0.0), 16, (LANE, 1)), 9);
        assert_eq!(cpu_threads_beside(16, (0.0, 0.0), 16, (LANE, 1)), 16);
        assert_eq!(cpu_threads_beside(16, (3.0, 0.0), 12, (LANE, 1)), 12);
        assert_eq!(cpu_threads_beside(4, (9.0, 0.0), 4, (LANE, 1)), 1);
        // A share following the rates: the lane's part of its cores where that is more.
        assert_eq!(gpu_lane_cores(LANE), 12);
        assert_eq!(cpu_threads_beside(16, (6.6, 0.9), 16, (LANE, 1)), 5);
        assert_eq!(cpu_threads_beside(16, (6.6, 1.0), 16, (LANE, 1)), 4);
        assert_eq!(cpu_threads_beside(16, (6.6, 0.5), 16, (LANE, 1)), 9);
        assert_eq!(cpu_threads_beside(64, (6.6, 1.0), 64, (LANE, 1)), 52);
        assert_eq!(cpu_threads_beside(16, (0.2, 0.04), 16, (LANE, 1)), 16);
        assert_eq!(cpu_threads_beside(8, (6.6, 1.0), 8, (LANE, 1)), 1);
        // A lane of views, with more preparing threads: its part is more, but the CPU lane
        // keeps the threads that make the views of the files the lane refuses.
        let views = (
            LANE + VIEWS_EXTRA_PREPARING_THREADS,
            VIEWS_CPU_THREADS_BESIDE,
        );
        assert_eq!(cpu_threads_beside(16, (6.6, 1.0), 16, (views.0, 1)), 1);
        assert_eq!(cpu_threads_beside(16, (6.6, 1.0), 16, views), 4);
        assert_eq!(cpu_threads_beside(16, (6.6, 0.6), 16, views), 7);
        assert_eq!(cpu_threads_beside(16, (11.0, 0.5), 16, views), 5);
        assert_eq!(cpu_threads_beside(16, (6.6, 1.0), 2, views), 2);
        assert_eq!(cpu_threads_beside(4, (6.6, 1.0), 16, views), 4);
    }
}
