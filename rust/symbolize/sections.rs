//! A debug file's sections as far as a symbolizer reads them: in place in the mapped file, or decompressed, whole or only the byte ranges asked for, into anonymous memory whose untouched pages cost nothing.

use std::borrow::Cow;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use memmap2::{Mmap, MmapMut};
use object::{CompressionFormat, Object, ObjectSection};

/// Where a byte range of a section ends.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(super) enum End {
    /// Where the DWARF initial length at the start says (a unit, a line program).
    Length,
    /// At this offset.
    At(usize),
}

/// What [`Compressed::walk_units`] does with the unit it shows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Walk {
    /// Leave the unit compressed and go on to the next.
    Skip,
    /// Decompress the unit and go on.
    Keep,
    /// Leave it and stop: nothing from here on is wanted (the rest is never decompressed).
    Stop,
}

/// Bytes decompressed or skipped at a time, between two looks at the input to release.
const CHUNK: usize = 256 << 10;

/// A decompressed section's bytes read one after the other (the only way a deflate stream
/// can be read), skipping the bytes that are not wanted. The pages of compressed input it has
/// consumed are given back as it goes (see [`Storage::trim`]).
struct Stream<'a> {
    input: &'a [u8],
    reader: flate2::read::ZlibDecoder<&'a [u8]>,
    at: usize,
    /// Where the input's pages have been given back up to (an address).
    released: usize,
}

impl<'a> Stream<'a> {
    fn new(input: &'a [u8]) -> Self {
        Stream {
            input,
            reader: flate2::read::ZlibDecoder::new(input),
            at: 0,
            released: input.as_ptr() as usize,
        }
    }

    /// Reads `out.len()` bytes at `offset` (not before the current position) into `out`.
    fn read_at(&mut self, offset: usize, out: &mut [u8]) -> Option<()> {
        let mut skip = offset.checked_sub(self.at)?;
        while skip > 0 {
            let skipped = std::io::copy(
                &mut (&mut self.reader).take(skip.min(CHUNK) as u64),
                &mut std::io::sink(),
            )
            .ok()?;
            if skipped == 0 {
                return None;
            }
            skip -= skipped as usize;
            self.release_input();
        }
        for part in out.chunks_mut(CHUNK) {
            self.reader.read_exact(part).ok()?;
            self.release_input();
        }
        self.at = offset + out.len();
        Some(())
    }

    /// Gives back the whole pages of input the decoder has consumed, a megabyte at a time.
    fn release_input(&mut self) {
        const AT_LEAST: usize = 1 << 20;
        let consumed = self.input.len() - self.reader.get_ref().len();
        let end = (self.input.as_ptr() as usize + consumed) & !(crate::sys::PAGE_SIZE - 1);
        let start = self.released.next_multiple_of(crate::sys::PAGE_SIZE);
        if end >= start + AT_LEAST {
            // SAFETY: the input lies in a private read-only file mapping of a `Storage`, never
            // written, and these pages are whole and already consumed: MADV_DONTNEED only drops
            // them (see `Storage::trim`).
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
            self.released = end;
        }
    }
}

/// The `n`-byte word (at most 8) at `at` in `bytes`.
pub(super) fn word(bytes: &[u8], at: usize, n: usize, little: bool) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(n)?)?;
    let mut v = [0u8; 8];
    if little {
        v[..n].copy_from_slice(b);
        Some(u64::from_le_bytes(v))
    } else {
        v[8 - n..].copy_from_slice(b);
        Some(u64::from_be_bytes(v))
    }
}

/// The DWARF initial length at the start of `bytes`: the length that follows it, and its own
/// size (4 bytes, or 12 in 64-bit DWARF).
pub(super) fn initial_length(bytes: &[u8], little: bool) -> Option<(usize, usize)> {
    match word(bytes, 0, 4, little)? {
        0xffff_ffff => Some((usize::try_from(word(bytes, 4, 8, little)?).ok()?, 12)),
        n if n < 0xffff_fff0 => Some((n as usize, 4)),
        _ => None,
    }
}

/// A section compressed with zlib, decompressed on demand.
pub(super) struct Compressed {
    data: &'static [u8],
    /// The section's full length once decompressed.
    pub(super) size: usize,
    /// The anonymous memory the section is decompressed into, at its own offsets; the bytes
    /// of ranges not asked for stay zero and are never touched.
    out: MmapMut,
    little: bool,
}

impl Compressed {
    /// A stream from the section's start.
    fn stream(&self) -> Stream<'static> {
        Stream::new(self.data)
    }

    /// Decompresses the ranges starting at `starts` (sorted, each with its end), in one pass.
    /// False if the stream is damaged (what was filled stays).
    pub(super) fn fill(&mut self, ranges: &[(usize, End)]) -> bool {
        let mut stream = self.stream();
        for &(start, end) in ranges {
            if start < stream.at || start >= self.size {
                continue; // overlaps the range before: already there
            }
            let end = match end {
                End::At(end) => end.min(self.size),
                End::Length => {
                    let head = start + 4.min(self.size - start);
                    if stream.read_at(start, &mut self.out[start..head]).is_none() {
                        return false;
                    }
                    let mut header_end = head;
                    if self.out[start..head] == [0xff; 4] && head + 8 <= self.size {
                        header_end = head + 8;
                        if stream
                            .read_at(head, &mut self.out[head..header_end])
                            .is_none()
                        {
                            return false;
                        }
                    }
                    let Some((length, size)) =
                        initial_length(&self.out[start..header_end], self.little)
                    else {
                        return false;
                    };
                    (start + size).saturating_add(length).min(self.size)
                }
            };
            let from = stream.at.max(start);
            if from < end && stream.read_at(from, &mut self.out[from..end]).is_none() {
                return false;
            }
        }
        true
    }

    /// Decompresses the whole section.
    pub(super) fn fill_all(&mut self) -> bool {
        self.fill(&[(0, End::At(self.size))])
    }

    /// Walks the DWARF units of a compressed `.debug_info`: calls `visit` with each unit's
    /// offset and its first bytes (up to 24, enough for any unit header), and decompresses the
    /// units it keeps, until it says stop. False if the stream is damaged.
    pub(super) fn walk_units(&mut self, mut visit: impl FnMut(usize, &[u8]) -> Walk) -> bool {
        let mut stream = self.stream();
        let mut offset = 0;
        while offset < self.size {
            // The initial length first (4 bytes, 12 in 64-bit DWARF), then the rest of the
            // header, never past the unit's end: a unit can be shorter than 24 bytes.
            let mut buffer = [0u8; 24];
            let mut read = 4.min(self.size - offset);
            if stream.read_at(offset, &mut buffer[..read]).is_none() {
                return false;
            }
            if buffer[..4] == [0xff; 4] && offset + 12 <= self.size {
                if stream.read_at(offset + 4, &mut buffer[4..12]).is_none() {
                    return false;
                }
                read = 12;
            }
            let Some((length, size)) = initial_length(&buffer[..read], self.little) else {
                return false;
            };
            let end = (offset + size).saturating_add(length).min(self.size);
            let head_end = (offset + 24).min(end).max(offset + read);
            if stream
                .read_at(offset + read, &mut buffer[read..head_end - offset])
                .is_none()
            {
                return false;
            }
            let head = &buffer[..head_end - offset];
            let walk = visit(offset, head);
            if walk == Walk::Stop {
                break;
            }
            if walk == Walk::Keep {
                self.out[offset..head_end].copy_from_slice(head);
                if head_end < end
                    && stream
                        .read_at(head_end, &mut self.out[head_end..end])
                        .is_none()
                {
                    return false;
                }
            }
            offset = end;
        }
        true
    }
}

/// One section of a debug file, as found.
pub(super) enum Section {
    /// Stored uncompressed (or absent: empty): read in place.
    InPlace(&'static [u8]),
    /// Compressed with zlib: nothing decompressed yet.
    Compressed(Compressed),
}

/// A mapped file and the sections decompressed from it. Their bytes stay where they are while
/// it lives, even when it moves (a map's pages), so the `'static` slices handed out point into
/// it for as long as the `DebugInfo` holding it exists. Decompressed sections are filled before
/// any reader of them is made, and never written again.
pub(super) struct Storage {
    map: Mmap,
    decompressed: Vec<MmapMut>,
}

impl Storage {
    pub(super) fn open(path: &Path) -> Option<Storage> {
        let file = File::open(path).ok()?;
        // SAFETY: the map is only read; a module file rewritten while the process runs is a
        // hazard every symbolizer accepts.
        let map = unsafe { Mmap::map(&file) }.ok()?;
        Some(Storage {
            map,
            decompressed: Vec::new(),
        })
    }

    /// The mapped bytes, for as long as `self` lives (see the type's docs).
    pub(super) fn bytes(&self) -> &'static [u8] {
        // SAFETY: the map is neither moved nor unmapped while `self` lives, and every borrower
        // (object files, symbol maps, contexts) is dropped before it (`DebugInfo` field order).
        unsafe { core::slice::from_raw_parts(self.map.as_ptr(), self.map.len()) }
    }

    /// Lets the kernel drop the pages of the mapped file read so far: they are clean copies of
    /// the file, read again from the page cache if touched again, so nothing that borrows them
    /// notices; the process's resident memory does not keep what one unit needed while the
    /// next is read.
    pub(super) fn trim(&self) {
        // SAFETY: a private read-only file mapping of our own, never written: MADV_DONTNEED
        // drops its pages, and the next access maps the file's bytes again.
        unsafe {
            libc::madvise(
                self.map.as_ptr() as *mut libc::c_void,
                self.map.len(),
                libc::MADV_DONTNEED,
            )
        };
    }

    /// A section as found: in place, or compressed with zlib (to fill and read with
    /// [`Storage::keep`]). Sections compressed otherwise are decompressed whole now.
    pub(super) fn section(&mut self, object: &object::File<'static>, name: &str) -> Section {
        let Some(section) = object.section_by_name(name) else {
            return Section::InPlace(&[]);
        };
        let Ok(compressed) = section.compressed_data() else {
            return Section::InPlace(&[]);
        };
        let size = usize::try_from(compressed.uncompressed_size).unwrap_or(usize::MAX);
        match compressed.format {
            CompressionFormat::None => Section::InPlace(compressed.data),
            CompressionFormat::Zlib => match MmapMut::map_anon(size.max(1)) {
                Ok(out) => Section::Compressed(Compressed {
                    data: compressed.data,
                    size,
                    out,
                    little: object.is_little_endian(),
                }),
                Err(_) => Section::InPlace(&[]),
            },
            _ => Section::InPlace(self.whole(object, name)),
        }
    }

    /// A section's data, decompressed whole into `self` if need be.
    pub(super) fn whole(&mut self, object: &object::File<'static>, name: &str) -> &'static [u8] {
        match self.section(object, name) {
            Section::InPlace(bytes) => bytes,
            Section::Compressed(mut compressed) => {
                if compressed.fill_all() {
                    self.keep(compressed)
                } else {
                    self.whole_by_object(object, name)
                }
            }
        }
    }

    /// Decompressed by `object` itself (the formats not streamed here).
    fn whole_by_object(&mut self, object: &object::File<'static>, name: &str) -> &'static [u8] {
        let Some(data) = object
            .section_by_name(name)
            .and_then(|s| s.uncompressed_data().ok())
        else {
            return &[];
        };
        match data {
            Cow::Borrowed(bytes) => bytes,
            Cow::Owned(bytes) => {
                let Ok(mut out) = MmapMut::map_anon(bytes.len().max(1)) else {
                    return &[];
                };
                out[..bytes.len()].copy_from_slice(&bytes);
                &self.keep_map(out)[..bytes.len()]
            }
        }
    }

    /// Keeps a filled section for as long as `self` lives; its bytes from then on.
    pub(super) fn keep(&mut self, compressed: Compressed) -> &'static [u8] {
        self.keep_map(compressed.out)
    }

    fn keep_map(&mut self, out: MmapMut) -> &'static [u8] {
        // SAFETY: the anonymous map does not move when pushed and is unmapped only with `self`,
        // after every borrower (as in `bytes`).
        let data = unsafe { core::slice::from_raw_parts(out.as_ptr(), out.len()) };
        self.decompressed.push(out);
        data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A `.debug_info`-like section of units of the given body lengths (32-bit DWARF, each
    /// unit's bytes its index), zlib-compressed into a [`Compressed`].
    fn units(bodies: &[usize]) -> (Vec<u8>, Compressed) {
        let mut plain = Vec::new();
        for (i, &body) in bodies.iter().enumerate() {
            plain.extend_from_slice(&(body as u32).to_le_bytes());
            plain.extend(std::iter::repeat_n(i as u8 + 1, body));
        }
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&plain).unwrap();
        let data: &'static [u8] = Box::leak(encoder.finish().unwrap().into_boxed_slice());
        let compressed = Compressed {
            data,
            size: plain.len(),
            out: MmapMut::map_anon(plain.len()).unwrap(),
            little: true,
        };
        (plain, compressed)
    }

    #[test]
    fn walks_every_unit_and_keeps_only_those_asked_for() {
        // Units shorter than a header (2 and 0 bytes of body) and one past the stream's
        // internal chunk size, so that skipping and reading both cross chunks.
        let bodies = [2, 30, 0, 3 * CHUNK + 5, 7];
        let (plain, mut compressed) = units(&bodies);
        let mut seen = Vec::new();
        assert!(compressed.walk_units(|offset, head| {
            seen.push((offset, head.len()));
            if offset != 0 && offset != 40 {
                Walk::Keep
            } else {
                Walk::Skip
            }
        }));
        let starts: Vec<usize> = bodies
            .iter()
            .scan(0, |at, &body| {
                let start = *at;
                *at += 4 + body;
                Some(start)
            })
            .collect();
        let offsets: Vec<usize> = seen.iter().map(|s| s.0).collect();
        assert_eq!(offsets, starts);
        assert_eq!(
            seen[0].1, 6,
            "a 6-byte unit gives 6 bytes, not the next unit's"
        );
        assert_eq!(seen[3].1, 24);
        for (i, &start) in starts.iter().enumerate() {
            let end = start + 4 + bodies[i];
            let kept = &compressed.out[start..end];
            if start == 0 || start == 40 {
                assert!(kept.iter().all(|&b| b == 0), "unit {i} was not asked for");
            } else {
                assert_eq!(kept, &plain[start..end], "unit {i}");
            }
        }
    }

    #[test]
    fn a_walk_told_to_stop_reads_no_further() {
        let bodies = [8, 3 * CHUNK, 8, 8];
        let (plain, mut compressed) = units(&bodies);
        let mut seen = Vec::new();
        assert!(compressed.walk_units(|offset, _| {
            seen.push(offset);
            match seen.len() {
                1 => Walk::Keep,
                2 => Walk::Skip,
                _ => Walk::Stop,
            }
        }));
        let third = 12 + 4 + 3 * CHUNK;
        assert_eq!(
            seen,
            [0, 12, third],
            "the unit after the stop is never read"
        );
        assert_eq!(compressed.out[..12], plain[..12]);
        assert!(compressed.out[12..].iter().all(|&b| b == 0));
    }

    #[test]
    fn fills_ranges_by_length_and_by_end() {
        let (plain, mut compressed) = units(&[10, CHUNK + 3, 5, 20]);
        let second = 14;
        let third = second + 4 + CHUNK + 3;
        let fourth = third + 9;
        assert!(compressed.fill(&[(second, End::Length), (fourth + 2, End::At(fourth + 6))]));
        assert_eq!(compressed.out[second..third], plain[second..third]);
        assert!(compressed.out[..second].iter().all(|&b| b == 0));
        assert!(compressed.out[third..fourth + 2].iter().all(|&b| b == 0));
        assert_eq!(
            compressed.out[fourth + 2..fourth + 6],
            plain[fourth + 2..fourth + 6]
        );
        assert!(compressed.out[fourth + 6..].iter().all(|&b| b == 0));
    }
}
