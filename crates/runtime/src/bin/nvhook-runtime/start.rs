//! What a libc would give nvhook-runtime: the start after the ELF entry point (the arch
//! module's `_start`), the static-pie self-relocation and a panic handler (the memory functions
//! the compiler calls: the mem module).

use crate::arch;

const DT_NULL: usize = 0;
const DT_RELA: usize = 7;
const DT_RELASZ: usize = 8;

#[repr(C)]
struct Dyn {
    tag: usize,
    val: usize,
}

#[repr(C)]
struct Rela {
    offset: usize,
    info: usize,
    addend: usize,
}

/// Called by the architecture's `_start` with the kernel's initial stack pointer.
pub(crate) unsafe extern "C" fn start(sp: *const usize) -> ! {
    // SAFETY: runs first, before anything reads a pointer stored in the image.
    unsafe { relocate() };
    // SAFETY: the kernel's initial stack: argc, then argc argv pointers and a NULL, then
    // envp pointers and a NULL.
    let (argc, argv) = unsafe { (*sp, sp.add(1) as *mut *const u8) };
    // SAFETY: as above.
    let envp = unsafe { argv.add(argc + 1) as *const *const u8 };
    crate::run::main(argc, argv, envp)
}

/// Applies the image's relative relocations: the binary is a static PIE (loaded at a random
/// address, as a dynamic one would be) with no loader to do it. Anything else is refused at
/// build time by tests/runtime_front.rs.
///
/// # Safety
/// Once, before any relocated data is read.
#[inline(never)]
unsafe fn relocate() {
    // PC-relative, so right before any relocation is applied.
    let (base, dynamic) = arch::image_base_and_dynamic();
    let dynamic = dynamic as *const Dyn;
    let (mut rela, mut size) = (0, 0);
    let mut d = dynamic;
    // SAFETY: _DYNAMIC is an array ending with DT_NULL.
    unsafe {
        while (*d).tag != DT_NULL {
            match (*d).tag {
                DT_RELA => rela = (*d).val,
                DT_RELASZ => size = (*d).val,
                _ => {}
            }
            d = d.add(1);
        }
    }
    let first = base.wrapping_add(rela) as *const Rela;
    for i in 0..size / core::mem::size_of::<Rela>() {
        // SAFETY: DT_RELA/DT_RELASZ describe the image's own relocation table, whose entries
        // name writable places inside the image.
        unsafe {
            let r = &*first.add(i);
            if r.info & 0xffff_ffff != arch::R_RELATIVE {
                crate::sys::exit(127);
            }
            *(base.wrapping_add(r.offset) as *mut usize) = base.wrapping_add(r.addend);
        }
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    crate::sys::write_all(2, b"nvhook-runtime: internal error\n");
    crate::sys::exit(127)
}

/// core's precompiled code names the unwinder's personality routine; nothing here unwinds
/// (the panic handler exits), so it is never called.
#[unsafe(no_mangle)]
extern "C" fn rust_eh_personality() {}
