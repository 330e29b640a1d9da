//! Call-stack capture at allocation time and the depot that stores each distinct stack once.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct StackId(pub u32);
pub const MAX_DEPTH: usize = 64;
#[derive(Clone, Copy, Debug)]
pub struct StartFrame {
    pub pc: usize,
    pub sp: usize,
    pub fp: usize,
}
impl StartFrame {
    /// # Safety
    /// frame_address is the frame of a live function with frame pointers.
    pub unsafe fn caller_of(frame_address: usize) -> StartFrame {
        StartFrame {
            pc: 0,
            sp: 0,
            fp: frame_address,
        }
    }
}
pub fn capture(_start: StartFrame, _depth: usize) -> StackId {
    StackId(0)
}
pub fn frames(_id: StackId) -> &'static [usize] {
    &[]
}
pub fn warm_up() {}
impl StartFrame {
    #[inline(always)]
    pub fn here() -> StartFrame {
        StartFrame {
            pc: 0,
            sp: 0,
            fp: 0,
        }
    }
}
