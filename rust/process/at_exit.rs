//! The report at exit. `cpp/new_delete.cpp` registers [`run`] with `__cxa_atexit` from the
//! destructor of the module that holds the tracker, inside the dynamic linker's `_dl_fini`: it
//! runs after every static destructor of the executable and of its shared libraries, wherever the
//! tracker was linked (proven by `tests/exit_order.rs` and `tests/shared_engine.rs`). Frees that
//! come later still work.

use crate::report::{self, text, Report};

pub fn run() {
    let _held = crate::sys::CancellationHeld::hold();
    let _headroom = crate::sys::DescriptorHeadroom::raise();
    crate::tracker::timeline::at_exit();
    if !crate::tracker::threads::begin_exit_report() {
        return;
    }
    let options = crate::options::get();
    if !options.report && options.exitcode == 0 {
        return; // nothing to write, nothing to decide
    }
    let me = crate::tracker::guard::me();
    let interrupted_the_tracker = crate::tracker::in_tracker(me);
    if interrupted_the_tracker {
        // `exit` from a signal handler that interrupted this thread inside the tracker: what
        // the thread was changing is read as it stands, and nothing is settled (see
        // `live_list::stop_settling`).
        crate::tracker::live_list::stop_settling();
    } else {
        // Outside the tracker: the caches' frees are to be applied now, not deferred.
        crate::tracker::malloc::release_runtime_caches();
        crate::tracker::apply_deferred_frees();
        crate::tracker::release_free_memory();
    }
    let _inside = crate::tracker::guard::Inside::enter();
    let stats = crate::tracker::stats();
    let errors = crate::tracker::errors::all().1;
    if options.malloc
        && stats.total_allocations == 0
        && errors == 0
        && !crate::engine::any_tracked_allocator_created()
    {
        // Nothing was ever tracked, not even the C runtime's `malloc`s (a Rust test binary that
        // links the library, say). With `malloc=0` a program may well have made no `new`: its
        // report is written all the same.
        return;
    }
    // A handler that interrupted the tracker called `exit`: the interrupted frames are live
    // (the thread's locals, a block between its `new` and its store), and the walk through
    // them cannot be asked for (the tracker's own walk may be what was interrupted).
    let live_stack = if interrupted_the_tracker {
        let here = 0u8;
        crate::stack::stack_above(core::ptr::addr_of!(here) as usize)
    } else {
        stack_of_exits_caller()
    };
    // Collected even with report=0: the exit code depends on what it finds.
    let report = Report::collect(live_stack);
    if options.report {
        let to = report::destination::choose(options, report::destination::Weight::of(&report));
        let (text_path, json_path, beside) = (&to.text, &to.json, &to.note);
        let line = match report::write(&report, text_path, json_path) {
            Ok(()) => match to
                .html
                .as_ref()
                .map(|html| report::page::write(json_path, html).map(|()| html))
            {
                None => format!("{}: see {text_path}{beside}\n", summary_line(&report)),
                Some(Ok(html)) => format!(
                    "{}: see {text_path} and {html}{beside}\n",
                    summary_line(&report)
                ),
                Some(Err(why)) => format!(
                    "k15-memory: could not write the HTML page: {why}\n{}: see {text_path}{beside}\n",
                    summary_line(&report)
                ),
            },
            Err(failed) if failed.path == *text_path => {
                // The report must not be lost: all of it goes to stderr instead.
                let mut err = std::io::BufWriter::new(std::io::stderr().lock());
                let _ = text::write(&mut err, &report);
                let _ = std::io::Write::flush(&mut err);
                format!(
                    "k15-memory: could not write the leak report to {}: {} (the report is above)\n{}\n",
                    failed.path,
                    failed.error,
                    summary_line(&report)
                )
            }
            Err(failed) => format!(
                "k15-memory: could not write the JSON report to {}: {}\n{}: see {text_path}\n",
                failed.path,
                failed.error,
                summary_line(&report)
            ),
        };
        crate::sys::write_fd(2, line.as_bytes());
    }
    if options.exitcode != 0 && report.counted_for_exit(options.leak_kinds) > 0 {
        crate::sys::exit_now(options.exitcode);
    }
}

/// Where the program called `exit` (or `quick_exit`) itself (a quit path deep in an engine,
/// with the game's state still in its callers' locals), the stack from the frame of `exit`'s
/// caller up: those frames are live, and valgrind and LeakSanitizer scan them. `None` when
/// `main` returned (the C runtime called `exit`: `main`'s frame is gone, and what lies below
/// the runtime's frames is stale), or when the walk through the exit handlers cannot tell.
fn stack_of_exits_caller() -> Option<core::ops::Range<usize>> {
    let mut frames = [0usize; crate::stack::MAX_DEPTH];
    let walked =
        crate::stack::capture::unwind_into_slice(crate::stack::StartFrame::here(), &mut frames);
    let frames = &frames[..walked];
    let exit = frames.iter().position(
        |&pc| matches!(symbol_of(pc).1, Some(name) if name == c"exit" || name == c"quick_exit"),
    )?;
    let caller = *frames.get(exit + 1)?;
    if symbol_of(caller).0 == symbol_of(frames[exit]).0 {
        return None; // called by the C library itself: `main` returned
    }
    let here = 0u8;
    let live = crate::stack::stack_above(core::ptr::addr_of!(here) as usize)?;
    // The slot `exit`'s call pushed its return address into: the caller's frame starts above.
    let word = core::mem::size_of::<usize>();
    let first = live.start.next_multiple_of(word);
    let slot = (first..live.end - word + 1).step_by(word).find(|&at| {
        // SAFETY: an aligned word of the calling thread's own stack, between its frame and the
        // stack's top: mapped and readable.
        unsafe { core::ptr::read(at as *const usize) == caller }
    })?;
    Some(slot + word..live.end)
}

/// The module (its load address) and the name of the exported function holding the code just
/// before the return address `pc` (`dladdr`).
fn symbol_of(pc: usize) -> (usize, Option<&'static core::ffi::CStr>) {
    let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only writes `info`; a zeroed Dl_info reads as "nothing found".
    let info = unsafe {
        libc::dladdr(pc.wrapping_sub(1) as *const libc::c_void, info.as_mut_ptr());
        info.assume_init()
    };
    let name = (!info.dli_sname.is_null()).then(|| {
        // SAFETY: dladdr's name is a string of the module's dynamic symbol table, which stays
        // mapped while the module does (through the exit report).
        unsafe { core::ffi::CStr::from_ptr(info.dli_sname) }
    });
    (info.dli_fbase as usize, name)
}

/// `k15-memory: 3 leaked blocks (1336 bytes), 2 reachable blocks (96 bytes), 0 memory errors`.
fn summary_line(report: &Report) -> String {
    use text::count;
    let leaked = report.leaked();
    let reachable = report.total(crate::options::LeakKind::Reachable);
    let mut line = format!(
        "k15-memory: {} ({})",
        count(leaked.blocks, "leaked block"),
        count(leaked.bytes, "byte")
    );
    if reachable.blocks > 0 {
        line += &format!(
            ", {} still reachable ({})",
            count(reachable.blocks, "block"),
            count(reachable.bytes, "byte")
        );
    }
    let suppressed = report.suppressed();
    if suppressed.blocks > 0 {
        line += &format!(", {} suppressed", count(suppressed.blocks, "block"));
    }
    line + &format!(", {}", count(report.error_count, "memory error"))
}
