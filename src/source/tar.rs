//! Tar shards in WebDataset's layout, read in place: an index of the members is built once from
//! the 512-byte headers (ustar, GNU long names, pax paths), members sharing a key (the name up
//! to the first dot of its last component) make a sample, and a sample's image member and `.cls`
//! label are found by extension. Nothing is extracted: the pipeline reads each image member with
//! positioned reads.
//!
//! A shard that is damaged loses only what is damaged: a member cut short by the end of the file,
//! a header whose checksum fails (the index skips to the next valid header), a sample without an
//! image member or with a label that is not an integer, an image member that is a link to
//! nothing in the shard, and a sample whose key an earlier one of the shard has, each become one
//! entry that reports the shard, the member and the reason when it is read; every good sample is
//! kept. Links are resolved as `tar -x` would: a hard link (GNU tar writes one for every further
//! name of a linked file) to the earlier member it names, a symbolic link relative to its own
//! folder, within the shard.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::folders::DECODED_EXTENSIONS;

/// Bytes of a tar block (and header).
const BLOCK: u64 = 512;

/// The largest member name or pax record this index reads (longer ones are malformed).
const MAX_NAME: u64 = 1 << 16;

/// The largest `.cls` member read as a label.
const MAX_LABEL_BYTES: u64 = 64;

/// One sample of a shard, or a damaged part of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A sample with its image member's place in the shard and its label.
    Sample {
        /// `shard:member`, naming the image member.
        id: String,
        offset: u64,
        len: u64,
        label: Option<u32>,
        /// The sample's other members (a `.json`, a `.seg.png`), for readers of targets.
        parts: Vec<Part>,
    },
    /// What cannot be read, and why; `at` is where in the shard.
    Damaged { id: String, reason: String, at: u64 },
}

/// A sample's member other than its image: its extension (lower case, without the first dot:
/// `json`, `seg.png`) and its bytes' place in the shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    pub ext: String,
    pub offset: u64,
    pub len: u64,
}

/// A member as the headers give it.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    offset: u64,
    len: u64,
    /// A link's target, as its header names it; `None` for a regular file.
    link: Option<Link>,
}

/// What a link member names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    /// A hard link: an earlier member, by its name in the shard.
    Hard(String),
    /// A symbolic link: a path relative to the link's folder.
    Symbolic(String),
    /// A link whose target could not be found in the shard, and why.
    Dangling(String),
}

/// The most symbolic links followed from one member.
const MAX_LINK_HOPS: usize = 16;

/// The samples of the shard at `path`, in the order their members appear. `Err` only when the
/// file cannot be opened or read at all.
pub(crate) fn index(path: &Path) -> std::io::Result<Vec<Entry>> {
    index_file(path, &super::path_id(path))
}

/// The samples of the shard in the file at `path`, named `shard` in ids and reasons (a shard
/// in object storage, kept in the cache folder, keeps its URL).
pub(crate) fn index_file(path: &Path, shard: &str) -> std::io::Result<Vec<Entry>> {
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    index_of(&file, size, shard)
}

/// The samples of a shard held whole in memory, named `shard` in ids and reasons.
#[cfg(feature = "object-store")]
pub(crate) fn index_bytes(bytes: &[u8], shard: &str) -> Vec<Entry> {
    // Reads from memory past the end are refused before they are made: no I/O error is left.
    index_of(bytes, bytes.len() as u64, shard).unwrap_or_default()
}

/// The samples of the `size` bytes of a shard read through `data`.
fn index_of<R: ReadAt + ?Sized>(data: &R, size: u64, shard: &str) -> std::io::Result<Vec<Entry>> {
    let (members, mut damaged) = members(data, size, shard)?;
    let mut entries = samples(data, shard, &members);
    entries.append(&mut damaged);
    // Everything in the order it sits in the shard.
    entries.sort_by_key(|e| match e {
        Entry::Sample { offset, .. } => *offset,
        Entry::Damaged { at, .. } => *at,
    });
    Ok(entries)
}

/// Positioned reads of a shard's bytes: a file, or the shard in memory.
trait ReadAt {
    /// Fills `buf` from `offset`, or fails.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

#[cfg(feature = "object-store")]
impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let part = start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(part);
        Ok(())
    }
}

/// The shard's regular-file members, and its damaged parts.
fn members<R: ReadAt + ?Sized>(
    file: &R,
    size: u64,
    shard: &str,
) -> std::io::Result<(Vec<Member>, Vec<Entry>)> {
    let mut members = Vec::new();
    let mut damaged = Vec::new();
    let mut at = 0u64;
    let mut long_name: Option<String> = None;
    let mut long_link: Option<String> = None;
    let mut header = [0u8; BLOCK as usize];
    while at + BLOCK <= size {
        file.read_exact_at(&mut header, at)?;
        if header.iter().all(|&b| b == 0) {
            // The end-of-archive marker.
            break;
        }
        if !checksum_ok(&header) {
            // Skip to the next block that is a valid header.
            let start = at;
            at += BLOCK;
            while at + BLOCK <= size {
                file.read_exact_at(&mut header, at)?;
                if checksum_ok(&header) && header.iter().any(|&b| b != 0) {
                    break;
                }
                at += BLOCK;
            }
            damaged.push(Entry::Damaged {
                id: format!("{shard}@{start}"),
                reason: format!(
                    "bad tar header (checksum) at byte {start}: bytes {start}..{at} skipped"
                ),
                at: start,
            });
            long_name = None;
            long_link = None;
            continue;
        }
        let Some(len) = octal_or_binary(&header[124..136]) else {
            damaged.push(Entry::Damaged {
                id: format!("{shard}@{at}"),
                reason: format!("bad tar header at byte {at}: its size is not a number"),
                at,
            });
            break;
        };
        let data = at + BLOCK;
        let name = long_name.take().unwrap_or_else(|| header_name(&header));
        if data.saturating_add(len) > size {
            damaged.push(Entry::Damaged {
                id: format!("{shard}:{name}"),
                reason: format!(
                    "tar member truncated: {len} bytes at byte {data}, the shard ends at {size}"
                ),
                at,
            });
            break;
        }
        // The member ends within the shard, so its padded end cannot overflow.
        let next = data + len.div_ceil(BLOCK) * BLOCK;
        let kind = header[156];
        if !matches!(kind, b'L' | b'K' | b'x') {
            // A long link name applies to this member only.
            let link_name = long_link.take().unwrap_or_else(|| field(&header[157..257]));
            let link = match kind {
                b'1' => Some(Link::Hard(link_name)),
                b'2' => Some(Link::Symbolic(link_name)),
                _ => None,
            };
            if matches!(kind, b'0' | 0 | b'7' | b'1' | b'2') {
                members.push(Member {
                    name,
                    offset: data,
                    len,
                    link,
                });
            }
        }
        match kind {
            // GNU long name (and long link name): the data is the next member's.
            b'L' | b'K' if len <= MAX_NAME => {
                let mut buf = vec![0u8; len as usize];
                file.read_exact_at(&mut buf, data)?;
                let text = field(&buf);
                if kind == b'L' {
                    long_name = Some(text);
                } else {
                    long_link = Some(text);
                }
            }
            // pax extended header: its `path` and `linkpath` records name the next member and
            // its target.
            b'x' if len <= MAX_NAME => {
                let mut buf = vec![0u8; len as usize];
                file.read_exact_at(&mut buf, data)?;
                long_name = pax_record(&buf, b"path");
                long_link = pax_record(&buf, b"linkpath");
            }
            _ => {}
        }
        at = next;
    }
    resolve_links(&mut members);
    Ok((members, damaged))
}

/// `a/./b/../c` as `a/c`; `None` when the path climbs out of the shard's root or is absolute.
fn normalize(path: &str) -> Option<String> {
    if path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// Gives each link member the place of the regular member it names (a hard link an earlier
/// member, a symbolic link one anywhere in the shard, through other links), or marks it
/// [`Link::Dangling`] with the reason.
fn resolve_links(members: &mut [Member]) {
    // Members by their normalized name. A link reads the first member of the name it names,
    // as the samples do (a later member of the same name is a duplicate key, reported).
    let mut by_name: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, m) in members.iter().enumerate() {
        if let Some(name) = normalize(&m.name) {
            by_name.entry(name).or_default().push(i);
        }
    }
    for i in 0..members.len() {
        let mut hops = 0;
        let mut current = i;
        let outcome = loop {
            let m = &members[current];
            let (target, before) = match &m.link {
                None => break Ok(current),
                Some(Link::Dangling(reason)) => break Err(reason.clone()),
                Some(Link::Hard(target)) => (normalize(target), Some(current)),
                Some(Link::Symbolic(target)) => {
                    let folder = m.name.rfind('/').map_or("", |end| &m.name[..end]);
                    let joined = if folder.is_empty() {
                        target.clone()
                    } else {
                        format!("{folder}/{target}")
                    };
                    (
                        (!target.starts_with('/'))
                            .then(|| normalize(&joined))
                            .flatten(),
                        None,
                    )
                }
            };
            let what = match &m.link {
                Some(Link::Hard(t)) => format!("a hard link to {t}"),
                Some(Link::Symbolic(t)) => format!("a symbolic link to {t}"),
                _ => String::new(),
            };
            let found = target.as_ref().and_then(|t| by_name.get(t)).and_then(|at| {
                at.iter()
                    .copied()
                    .find(|&j| before.is_none_or(|b| j < b) && j != current)
            });
            match (target, found) {
                (None, _) => break Err(format!("{what}, outside the shard")),
                (Some(_), None) if before.is_some() => {
                    break Err(format!("{what}, which no earlier member of the shard is"))
                }
                (Some(_), None) => break Err(format!("{what}, which is not in the shard")),
                (Some(_), Some(j)) => {
                    hops += 1;
                    if hops > MAX_LINK_HOPS {
                        break Err(format!("{what}: links lead to links {MAX_LINK_HOPS} times"));
                    }
                    current = j;
                }
            }
        };
        match outcome {
            Ok(j) if j != i => {
                let (offset, len) = (members[j].offset, members[j].len);
                let m = &mut members[i];
                m.offset = offset;
                m.len = len;
                m.link = None;
            }
            Ok(_) => {}
            Err(reason) => members[i].link = Some(Link::Dangling(reason)),
        }
    }
}

/// Groups consecutive members by WebDataset's key into samples. A member whose extension the
/// sample already has starts another sample of the same key; a key an earlier sample of the
/// shard had is reported as a duplicate, not delivered twice under one id.
fn samples<R: ReadAt + ?Sized>(file: &R, shard: &str, members: &[Member]) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut seen: HashMap<&str, u64> = HashMap::new();
    let mut i = 0;
    while i < members.len() {
        let Some((key, _)) = split_key(&members[i].name) else {
            // No extension: not part of any sample (as WebDataset skips it).
            i += 1;
            continue;
        };
        let mut extensions = HashSet::new();
        let mut j = i;
        while let Some((k, extension)) = members.get(j).and_then(|m| split_key(&m.name)) {
            if k != key || !extensions.insert(extension.to_ascii_lowercase()) {
                break;
            }
            j += 1;
        }
        let at = members[i].offset;
        match seen.get(key) {
            Some(&first) => entries.push(Entry::Damaged {
                id: format!("{shard}:{}", members[i].name),
                reason: format!(
                    "duplicate key {key}: the sample at byte {first} of the shard has it \
                     already; this one is left out"
                ),
                at,
            }),
            None => {
                seen.insert(key, at);
                entries.push(sample(file, shard, key, &members[i..j]));
            }
        }
        i = j;
    }
    entries
}

/// One sample from its members.
fn sample<R: ReadAt + ?Sized>(file: &R, shard: &str, key: &str, members: &[Member]) -> Entry {
    fn extension(m: &Member) -> &str {
        split_key(&m.name).map_or("", |(_, e)| e)
    }
    let image = members.iter().find(|m| {
        DECODED_EXTENSIONS
            .iter()
            .any(|ext| ext.eq_ignore_ascii_case(extension(m)))
    });
    let Some(image) = image else {
        let found: Vec<String> = members
            .iter()
            .map(|m| format!(".{}", extension(m)))
            .collect();
        return Entry::Damaged {
            id: format!("{shard}:{key}"),
            reason: format!(
                "sample without an image member (it has {}; looked for .{})",
                found.join(", "),
                DECODED_EXTENSIONS.join(", .")
            ),
            at: members[0].offset,
        };
    };
    let id = format!("{shard}:{}", image.name);
    if let Some(Link::Dangling(reason)) = &image.link {
        return Entry::Damaged {
            id,
            reason: format!("the image member is {reason}"),
            at: image.offset,
        };
    }
    let label = match members
        .iter()
        .find(|m| extension(m).eq_ignore_ascii_case("cls"))
    {
        None => None,
        Some(Member {
            name,
            link: Some(Link::Dangling(reason)),
            ..
        }) => {
            return Entry::Damaged {
                id,
                reason: format!("{name}: the label member is {reason}"),
                at: image.offset,
            }
        }
        Some(cls) => match read_label(file, cls) {
            Ok(label) => Some(label),
            Err(reason) => {
                return Entry::Damaged {
                    id,
                    reason: format!("{}: {reason}", cls.name),
                    at: image.offset,
                }
            }
        },
    };
    let parts = members
        .iter()
        .filter(|m| !std::ptr::eq(*m, image) && !matches!(m.link, Some(Link::Dangling(_))))
        .map(|m| Part {
            ext: extension(m).to_ascii_lowercase(),
            offset: m.offset,
            len: m.len,
        })
        .collect();
    Entry::Sample {
        id,
        offset: image.offset,
        len: image.len,
        label,
        parts,
    }
}

/// A `.cls` member's integer.
fn read_label<R: ReadAt + ?Sized>(file: &R, cls: &Member) -> Result<u32, String> {
    if cls.len > MAX_LABEL_BYTES {
        return Err(format!(
            "a label of {} bytes is not a class number",
            cls.len
        ));
    }
    let mut buf = vec![0u8; cls.len as usize];
    file.read_exact_at(&mut buf, cls.offset)
        .map_err(|e| format!("cannot read it: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    text.trim()
        .parse()
        .map_err(|_| format!("label {:?} is not a class number", text.trim()))
}

/// WebDataset's key and extension: the name up to the first dot of its last component, and
/// the rest (`a/b.c.d` is key `a/b`, extension `c.d`); `None` without a dot.
fn split_key(name: &str) -> Option<(&str, &str)> {
    let base = name.rfind('/').map_or(0, |i| i + 1);
    let dot = name[base..].find('.')? + base;
    (dot > base).then(|| (&name[..dot], &name[dot + 1..]))
}

/// A NUL-terminated text field.
fn field(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The header's name: `prefix/name` for ustar, `name` otherwise.
fn header_name(header: &[u8; BLOCK as usize]) -> String {
    let name = field(&header[0..100]);
    // POSIX ustar only: GNU's magic ("ustar  ") keeps other fields where ustar has the prefix.
    if &header[257..263] == b"ustar\0" {
        let prefix = field(&header[345..500]);
        if !prefix.is_empty() {
            return format!("{prefix}/{name}");
        }
    }
    name
}

/// The checksum: the header's bytes summed with the checksum field as spaces.
fn checksum_ok(header: &[u8; BLOCK as usize]) -> bool {
    let Some(stored) = octal_or_binary(&header[148..156]) else {
        return false;
    };
    let sum: u64 = header
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                b as u64
            }
        })
        .sum();
    sum == stored
}

/// A numeric field: octal text (space or NUL terminated), or GNU's base-256 (high bit set).
fn octal_or_binary(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        let mut value = u64::from(field[0] & 0x7F);
        for &b in &field[1..] {
            value = value.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(value);
    }
    let text: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0 && b != b' ')
        .collect();
    if text.is_empty() {
        return Some(0);
    }
    let text = std::str::from_utf8(&text).ok()?;
    u64::from_str_radix(text, 8).ok()
}

/// The record `key` of a pax extended header (`LEN key=VALUE\n` records).
fn pax_record(data: &[u8], key: &[u8]) -> Option<String> {
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
        if len <= space || len > rest.len() {
            return None;
        }
        let record = &rest[space + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(value) = record
            .strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(b"="))
        {
            return Some(String::from_utf8_lossy(value).into_owned());
        }
        rest = &rest[len..];
    }
    None
}

/// The `.tar` files directly inside `dir`, in sorted order.
pub(crate) fn shards_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut shards = super::folders::read_dir_sorted(dir)?;
    shards.retain(|p| {
        p.extension().is_some_and(|e| e.eq_ignore_ascii_case("tar"))
            && p.metadata().is_ok_and(|m| m.is_file())
    });
    Ok(shards)
}

/// Where a sample's image lives: the shard and the member's bytes in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberPlace {
    pub shard: Arc<PathBuf>,
    pub offset: u64,
    pub len: u64,
    /// The sample's other members.
    pub parts: Arc<[Part]>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tar archive of `members` (name, bytes), ustar headers, names longer than 100 bytes as
    /// GNU long names, with the end-of-archive blocks.
    pub(crate) fn tar(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in members {
            if name.len() >= 100 {
                let mut long = name.as_bytes().to_vec();
                long.push(0);
                out.extend(header("././@LongLink", long.len() as u64, b'L'));
                out.extend(&long);
                pad(&mut out);
            }
            out.extend(header(&name[..name.len().min(99)], data.len() as u64, b'0'));
            out.extend(*data);
            pad(&mut out);
        }
        out.extend([0u8; 1024]);
        out
    }

    fn pad(out: &mut Vec<u8>) {
        while !out.len().is_multiple_of(512) {
            out.push(0);
        }
    }

    pub(crate) fn header(name: &str, len: u64, kind: u8) -> Vec<u8> {
        link_header(name, len, kind, "")
    }

    /// A header naming `target` in its link field.
    pub(crate) fn link_header(name: &str, len: u64, kind: u8, target: &str) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[157..157 + target.len()].copy_from_slice(target.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        h[108..116].copy_from_slice(b"0000000\0");
        h[116..124].copy_from_slice(b"0000000\0");
        h[124..136].copy_from_slice(format!("{len:011o}\0").as_bytes());
        h[136..148].copy_from_slice(b"00000000000\0");
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        h
    }

    #[test]
    fn keys_split_as_webdataset_splits_them() {
        assert_eq!(split_key("a/b.c.d"), Some(("a/b", "c.d")));
        assert_eq!(split_key("n0144/x_10.JPEG"), Some(("n0144/x_10", "JPEG")));
        assert_eq!(split_key("dir.v2/file"), None);
        assert_eq!(split_key(".hidden"), None);
        assert_eq!(octal_or_binary(b"00000001750\0"), Some(1000));
        assert_eq!(
            octal_or_binary(&[0x80, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]),
            Some(1 << 32)
        );
        assert_eq!(
            pax_record(b"20 path=abc/def.jpg\n", b"path"),
            Some("abc/def.jpg".into())
        );
        assert_eq!(
            pax_record(b"20 path=abc/def.jpg\n18 linkpath=x.jpg\n", b"linkpath"),
            Some("x.jpg".into())
        );
        assert_eq!(normalize("./a/b/../c.jpg"), Some("a/c.jpg".into()));
        assert_eq!(normalize("../c.jpg"), None);
    }

    fn written(bytes: &[u8]) -> (tempdir::Dir, PathBuf) {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("shard-0.tar");
        std::fs::write(&path, bytes).expect("write");
        (dir, path)
    }

    /// A folder removed when dropped.
    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let dir = std::env::temp_dir().join(format!(
                    "gpufeed-tar-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&dir).expect("temp dir");
                Dir(dir)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn samples_group_members_by_key_with_their_labels() {
        let long = format!("{}/deep.jpg", "d".repeat(120));
        let bytes = tar(&[
            ("a.jpg", b"AAAA"),
            ("a.cls", b"3\n"),
            ("b.png", b"BB"),
            ("b.json", b"{}"),
            (&long, b"LONG"),
            ("README", b"no key"),
            ("c.txt", b"no image"),
            ("d.jpg", b"DD"),
            ("d.cls", b"seven"),
        ]);
        let (_dir, path) = written(&bytes);
        let entries = index(&path).expect("index");
        let shard = path.display().to_string();
        let sample = |e: &Entry| match e {
            Entry::Sample {
                id,
                offset,
                len,
                label,
                ..
            } => {
                let data = &bytes[*offset as usize..(*offset + *len) as usize];
                (id.clone(), data.to_vec(), *label)
            }
            Entry::Damaged { id, reason, .. } => panic!("{id}: {reason}"),
        };
        assert_eq!(entries.len(), 5, "{entries:?}");
        assert_eq!(
            sample(&entries[0]),
            (format!("{shard}:a.jpg"), b"AAAA".to_vec(), Some(3))
        );
        assert_eq!(
            sample(&entries[1]),
            (format!("{shard}:b.png"), b"BB".to_vec(), None)
        );
        assert_eq!(
            sample(&entries[2]),
            (format!("{shard}:{long}"), b"LONG".to_vec(), None)
        );
        let damaged = |e: &Entry| match e {
            Entry::Damaged { id, reason, .. } => (id.clone(), reason.clone()),
            other => panic!("expected damage, got {other:?}"),
        };
        let (id, reason) = damaged(&entries[3]);
        assert_eq!(id, format!("{shard}:c"));
        assert!(reason.contains("without an image member"), "{reason}");
        let (id, reason) = damaged(&entries[4]);
        assert_eq!(id, format!("{shard}:d.jpg"));
        assert!(
            reason.contains("d.cls") && reason.contains("seven"),
            "{reason}"
        );
    }

    #[test]
    fn a_damaged_shard_reports_its_bad_parts_and_keeps_its_good_samples() {
        let mut bytes = tar(&[
            ("a.jpg", b"AAAA"),
            ("b.jpg", b"BBBB"),
            ("c.jpg", b"CCCC"),
            ("d.jpg", &[7u8; 3000]),
        ]);
        // Corrupt b's header: its checksum fails, the index finds c's header next.
        bytes[1024 + 10] ^= 0xFF;
        // Cut the shard inside d's data.
        bytes.truncate(3 * 1024 + 512 + 1000);
        let (_dir, path) = written(&bytes);
        let entries = index(&path).expect("index");
        let ids: Vec<String> = entries
            .iter()
            .map(|e| match e {
                Entry::Sample { id, .. } | Entry::Damaged { id, .. } => id.clone(),
            })
            .collect();
        let shard = path.display().to_string();
        assert_eq!(
            ids,
            vec![
                format!("{shard}:a.jpg"),
                format!("{shard}@1024"),
                format!("{shard}:c.jpg"),
                format!("{shard}:d.jpg"),
            ]
        );
        assert!(matches!(entries[0], Entry::Sample { .. }));
        assert!(
            matches!(&entries[1], Entry::Damaged { reason, .. } if reason.contains("checksum"))
        );
        assert!(matches!(entries[2], Entry::Sample { .. }));
        assert!(
            matches!(&entries[3], Entry::Damaged { reason, .. } if reason.contains("truncated"))
        );
    }

    /// Hard links to earlier members and symbolic links within the shard are read as their
    /// target; links to nothing in the shard, and keys seen before, are reported, each once.
    #[test]
    fn links_are_resolved_and_duplicate_keys_reported() {
        fn member(bytes: &mut Vec<u8>, name: &str, data: &[u8]) {
            bytes.extend(header(name, data.len() as u64, b'0'));
            bytes.extend(data);
            while !bytes.len().is_multiple_of(512) {
                bytes.push(0);
            }
        }
        let mut bytes = Vec::new();
        member(&mut bytes, "a.jpg", b"AAAA");
        member(&mut bytes, "a.cls", b"1");
        let mut links = Vec::new();
        for (name, kind, target) in [
            ("b.jpg", b'1', "a.jpg"),
            ("dir/c.jpg", b'2', "../a.jpg"),
            ("d.jpg", b'2', "/etc/passwd"),
            ("e.jpg", b'2', "missing.jpg"),
            ("f.jpg", b'1', "g.jpg"),
        ] {
            links.extend(link_header(name, 0, kind, target));
        }
        bytes.extend(links);
        member(&mut bytes, "g.jpg", b"GG");
        member(&mut bytes, "g.jpg", b"G2");
        member(&mut bytes, "a.jpg", b"again");
        bytes.extend([0u8; 1024]);
        let (_dir, path) = written(&bytes);
        let shard = path.display().to_string();
        let entries = index(&path).expect("index");
        let got: Vec<(String, Result<Vec<u8>, String>)> = entries
            .iter()
            .map(|e| match e {
                Entry::Sample {
                    id, offset, len, ..
                } => (
                    id.strip_prefix(&format!("{shard}:"))
                        .expect("id")
                        .to_string(),
                    Ok(bytes[*offset as usize..(*offset + *len) as usize].to_vec()),
                ),
                Entry::Damaged { id, reason, .. } => (
                    id.strip_prefix(&format!("{shard}:"))
                        .expect("id")
                        .to_string(),
                    Err(reason.clone()),
                ),
            })
            .collect();
        let names: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(
            names,
            [
                "a.jpg",
                "b.jpg",
                "dir/c.jpg",
                "d.jpg",
                "e.jpg",
                "f.jpg",
                "g.jpg",
                "g.jpg",
                "a.jpg"
            ]
        );
        assert_eq!(got[0].1, Ok(b"AAAA".to_vec()));
        assert_eq!(
            got[1].1,
            Ok(b"AAAA".to_vec()),
            "a hard link reads its target"
        );
        assert_eq!(
            got[2].1,
            Ok(b"AAAA".to_vec()),
            "a symbolic link reads its target"
        );
        let reason = |i: usize| got[i].1.clone().expect_err("damaged");
        assert!(reason(3).contains("symbolic link to /etc/passwd, outside the shard"));
        assert!(reason(4).contains("symbolic link to missing.jpg, which is not in the shard"));
        assert!(reason(5).contains("hard link to g.jpg, which no earlier member"));
        assert_eq!(got[6].1, Ok(b"GG".to_vec()));
        assert!(reason(7).contains("duplicate key g"), "{}", reason(7));
        assert!(reason(8).contains("duplicate key a"), "{}", reason(8));
    }
}
