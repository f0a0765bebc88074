//! What reading from object storage took, per epoch.

/// What reading one epoch (or opening a source) took from object storage: requests, bytes,
/// the local cache's part and the time decoders waited for bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadReport {
    /// Requests sent: GETs (each range of a shard read in ranges is one, and each retry), HEADs
    /// and listing pages.
    pub requests: u64,
    /// Bytes received from the store.
    pub bytes: u64,
    /// Objects (shards, or images) read from the store.
    pub fetched: u64,
    /// Objects read from the local cache instead of the store.
    pub cache_hits: u64,
    /// Bytes of those objects.
    pub cache_bytes: u64,
    /// Objects still held in memory when the epoch began (read for the epoch before), used
    /// again without a request.
    pub kept: u64,
    /// Objects that could not be read after the retries (their samples were reported).
    pub failed: u64,
    /// Times a decoder asked for bytes that were not read yet and waited.
    pub waits: u64,
    /// Time decoders spent waiting so, in all (summed over threads).
    pub waited: std::time::Duration,
    /// Copies in the cache folder found damaged (cut short, or not the bytes written: their
    /// checksum differs), removed and read from the store again; shard indexes included.
    pub cache_rejected: u64,
}

impl ReadReport {
    /// Share of the objects used that needed no request: read from the cache folder or still
    /// in memory, 0 to 1 (0 when none was used).
    pub fn cache_hit_rate(&self) -> f64 {
        let hits = self.cache_hits + self.kept;
        let all = hits + self.fetched;
        if all == 0 {
            0.0
        } else {
            hits as f64 / all as f64
        }
    }
}
