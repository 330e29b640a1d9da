//! A DWARF line program run straight from its bytes: the rows gimli's `LineRows::next_row` yields (address, file, line, end of sequence), at a few instructions per opcode.
//!
//! gimli decodes each instruction into an enum through its generic reader and then executes
//! it; on the line programs of yaml-cpp's test units that was 3 ms of the report's 11. Here the
//! common opcodes are decoded and executed in one loop over a byte slice. What this does not
//! model (VLIW op indexes, big-endian files, DWARF 4's `DW_LNE_define_file`) ends the run with
//! [`Run::Unsupported`], so the caller runs gimli's instead; bytes that do not read (where
//! gimli's reader fails too) end it with [`Run::Malformed`].

use addr2line::gimli::{self, LineProgramHeader, Reader};

use super::resolver::Slice;

/// How a run ended short of the program's end.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Run {
    /// The program uses what this interpreter leaves to gimli: run gimli's rows instead.
    Unsupported,
    /// The bytes do not read as a line program (gimli fails on them too).
    Malformed,
}

/// A row of the line table, as far as a lookup needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LineRow {
    pub(super) address: u64,
    pub(super) file: u64,
    /// The line register as gimli keeps it (0: no line).
    pub(super) line: u64,
    pub(super) end_sequence: bool,
}

impl LineRow {
    /// The same row as gimli's state machine gives it.
    pub(super) fn of(row: &gimli::LineRow) -> LineRow {
        LineRow {
            address: row.address(),
            file: row.file_index(),
            line: row.line().map_or(0, |line| line.get()),
            end_sequence: row.end_sequence(),
        }
    }
}

/// Calls `row` for every row of the program `header` heads, in order, as gimli's
/// `LineRows::next_row` yields them (tombstoned sequences skipped the same way). On
/// [`Run::Unsupported`] some rows may have been given already: the caller starts over with
/// gimli's.
pub(super) fn for_each_row(
    header: &LineProgramHeader<Slice>,
    mut row: impl FnMut(LineRow),
) -> Result<(), Run> {
    use gimli::constants as dw;
    let program = header.raw_program_buf();
    let encoding = header.line_encoding();
    if encoding.maximum_operations_per_instruction != 1
        || gimli::Endianity::is_big_endian(program.endian())
    {
        return Err(Run::Unsupported);
    }
    if encoding.line_range == 0 {
        return Err(Run::Malformed); // gimli divides by it
    }
    let opcode_lengths: &[u8] = header.standard_opcode_lengths().slice();
    let address_size = header.address_size();
    if !matches!(address_size, 1 | 2 | 4 | 8) {
        return Err(Run::Malformed);
    }
    let address_mask = u64::MAX >> (64 - 8 * u32::from(address_size));
    // gimli's `min_tombstone`: -2 in the address size.
    let tombstone_from = address_mask - 1;
    let min_length = u64::from(encoding.minimum_instruction_length);
    let (opcode_base, line_base, line_range) = (
        header.opcode_base(),
        encoding.line_base,
        encoding.line_range,
    );
    // Each special opcode's line step and address advance, worked out once: a division by
    // `line_range` for every row was a fifth of the interpreter's time.
    let specials: [(i64, u64); 256] = core::array::from_fn(|opcode| {
        let adjusted = (opcode as u8).wrapping_sub(opcode_base);
        (
            i64::from(line_base) + i64::from(adjusted % line_range),
            u64::from(adjusted / line_range) * min_length,
        )
    });
    // gimli's `add_sized`: an address past the address size is an error.
    let advance = |address: u64, by: u64| -> Result<u64, Run> {
        match address.checked_add(by) {
            Some(to) if to <= address_mask => Ok(to),
            _ => Err(Run::Malformed),
        }
    };

    let fresh = LineRow {
        address: 0,
        file: 1,
        line: 1,
        end_sequence: false,
    };
    let mut state = fresh;
    let mut tombstone = false;
    let mut bytes = Bytes {
        data: program.slice(),
        at: 0,
    };
    while let Some(opcode) = bytes.next() {
        let emit = if opcode >= opcode_base {
            let (line_step, by) = specials[usize::from(opcode)];
            state.line = line_advance(state.line, line_step);
            if !tombstone {
                state.address = advance(state.address, by)?;
            }
            true
        } else if opcode == 0 {
            let length = usize::try_from(bytes.uleb()?).map_err(|_| Run::Malformed)?;
            let mut operands = bytes.split(length)?;
            match dw::DwLne(operands.next().ok_or(Run::Malformed)?) {
                dw::DW_LNE_end_sequence => {
                    state.end_sequence = true;
                    true
                }
                dw::DW_LNE_set_address => {
                    let address = operands.address(address_size)?;
                    tombstone = address < state.address || address >= tombstone_from;
                    if !tombstone {
                        state.address = address;
                    }
                    false
                }
                // It adds to the header's file table as the program runs.
                dw::DW_LNE_define_file if header.version() <= 4 => return Err(Run::Unsupported),
                dw::DW_LNE_set_discriminator => {
                    operands.uleb()?;
                    false
                }
                _ => false, // an unknown extended opcode is skipped whole, as gimli does
            }
        } else {
            match dw::DwLns(opcode) {
                dw::DW_LNS_copy => true,
                dw::DW_LNS_advance_pc => {
                    let by = bytes.uleb()?;
                    if !tombstone {
                        state.address = advance(state.address, min_length.wrapping_mul(by))?;
                    }
                    false
                }
                dw::DW_LNS_advance_line => {
                    state.line = line_advance(state.line, bytes.sleb()?);
                    false
                }
                dw::DW_LNS_set_file => {
                    state.file = bytes.uleb()?;
                    false
                }
                dw::DW_LNS_set_column | dw::DW_LNS_set_isa => {
                    bytes.uleb()?;
                    false
                }
                dw::DW_LNS_const_add_pc => {
                    if !tombstone {
                        let by = u64::from((255 - opcode_base) / line_range) * min_length;
                        state.address = advance(state.address, by)?;
                    }
                    false
                }
                dw::DW_LNS_fixed_advance_pc => {
                    let by = bytes.u16()?;
                    if !tombstone {
                        state.address = advance(state.address, u64::from(by))?;
                    }
                    false
                }
                dw::DW_LNS_negate_stmt
                | dw::DW_LNS_set_basic_block
                | dw::DW_LNS_set_prologue_end
                | dw::DW_LNS_set_epilogue_begin => false,
                // An unknown standard opcode: as many LEB128 operands as the header says.
                _ => {
                    let operands = opcode_lengths
                        .get(usize::from(opcode) - 1)
                        .ok_or(Run::Malformed)?;
                    for _ in 0..*operands {
                        bytes.uleb()?;
                    }
                    false
                }
            }
        };
        if emit {
            if !tombstone {
                row(state);
            }
            if state.end_sequence {
                (state, tombstone) = (fresh, false);
            }
        }
    }
    Ok(())
}

/// gimli's `apply_line_advance`: a decrement below 0 stops at 0, an increment wraps.
fn line_advance(line: u64, by: i64) -> u64 {
    if by < 0 {
        line.saturating_sub(by.unsigned_abs())
    } else {
        line.wrapping_add(by as u64)
    }
}

/// A cursor over a line program's bytes; every read past the end is [`Run::Malformed`].
struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Bytes<'a> {
    #[inline(always)]
    fn next(&mut self) -> Option<u8> {
        let byte = *self.data.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    #[inline(always)]
    fn uleb(&mut self) -> Result<u64, Run> {
        let mut value = 0u64;
        let mut shift = 0;
        loop {
            let byte = self.next().ok_or(Run::Malformed)?;
            if shift == 63 && byte > 1 {
                return Err(Run::Malformed); // gimli's reader: more than 64 bits
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
            shift += 7;
            if shift > 63 {
                return Err(Run::Malformed);
            }
        }
    }

    #[inline(always)]
    fn sleb(&mut self) -> Result<i64, Run> {
        let mut value = 0i64;
        let mut shift = 0;
        loop {
            let byte = self.next().ok_or(Run::Malformed)?;
            if shift == 63 && byte != 0 && byte != 0x7f {
                return Err(Run::Malformed);
            }
            value |= i64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                if shift < 64 && byte & 0x40 != 0 {
                    value |= -1 << shift; // sign-extend
                }
                return Ok(value);
            }
            if shift > 63 {
                return Err(Run::Malformed);
            }
        }
    }

    fn u16(&mut self) -> Result<u16, Run> {
        let bytes = self.data.get(self.at..self.at + 2).ok_or(Run::Malformed)?;
        self.at += 2;
        Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
    }

    /// A little-endian address of `size` (at most 8) bytes.
    fn address(&mut self, size: u8) -> Result<u64, Run> {
        let size = usize::from(size);
        let bytes = self
            .data
            .get(self.at..self.at + size)
            .ok_or(Run::Malformed)?;
        self.at += size;
        let mut word = [0u8; 8];
        word[..size].copy_from_slice(bytes);
        Ok(u64::from_le_bytes(word))
    }

    /// The next `length` bytes as a cursor of their own, skipped here.
    fn split(&mut self, length: usize) -> Result<Bytes<'a>, Run> {
        let end = self.at.checked_add(length).ok_or(Run::Malformed)?;
        let data = self.data.get(self.at..end).ok_or(Run::Malformed)?;
        self.at = end;
        Ok(Bytes { data, at: 0 })
    }
}
