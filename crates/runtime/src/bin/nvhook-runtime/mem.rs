//! The C functions the compiler lowers copies, fills, comparisons and string scans to: with no
//! libc, the program brings its own, one set for every architecture.
//!
//! Byte loops through volatile accesses: the compiler recognises a plain copy, fill or compare
//! loop and replaces it with a call to memcpy, memset or memcmp, which here would be a call to
//! the function itself. The program copies and fills a few paths at most, so bytes are enough.

use core::ptr::{read_volatile, write_volatile};

/// # Safety
/// As C's memcpy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    let mut i = 0;
    while i < n {
        // SAFETY: as C's memcpy: `src` and `dst` hold `n` bytes each.
        unsafe { write_volatile(dst.add(i), read_volatile(src.add(i))) };
        i += 1;
    }
    dst
}

/// # Safety
/// As C's memmove.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize).wrapping_sub(src as usize) >= n {
        // SAFETY: forward copying is safe when dst does not start inside src.
        return unsafe { memcpy(dst, src, n) };
    }
    let mut i = n;
    while i > 0 {
        i -= 1;
        // SAFETY: backward, from the last byte, as dst starts inside src: each byte of src is
        // read before the copy overwrites it.
        unsafe { write_volatile(dst.add(i), read_volatile(src.add(i))) };
    }
    dst
}

/// # Safety
/// As C's memset.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    let mut i = 0;
    while i < n {
        // SAFETY: as C's memset: `dst` holds `n` bytes.
        unsafe { write_volatile(dst.add(i), c as u8) };
        i += 1;
    }
    dst
}

/// # Safety
/// As C's memcmp.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: both point to `n` readable bytes.
        let (x, y) = unsafe { (read_volatile(a.add(i)), read_volatile(b.add(i))) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// # Safety
/// As C's bcmp.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: as the caller promises.
    unsafe { memcmp(a, b, n) }
}

/// # Safety
/// As C's strlen.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strlen(s: *const u8) -> usize {
    let mut n = 0;
    // SAFETY: `s` is NUL-terminated.
    while unsafe { read_volatile(s.add(n)) } != 0 {
        n += 1;
    }
    n
}
