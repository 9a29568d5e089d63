//! aarch64's loader cache on any machine: a real one, written by Debian's arm64 glibc 2.43
//! `ldconfig` (run under qemu-aarch64-static on the arm64 libc6 package's libraries:
//! `ldconfig -r ROOT -X`, 6 entries), and what nvhook writes for an aarch64 container.

use nvhook_ldcache::{Arch, ElfClass, Entry, LdCache};

const REAL: &[u8] = include_bytes!("data/aarch64-debian-ld.so.cache");
const LIB: &str = "/usr/lib/aarch64-linux-gnu";

#[test]
fn a_real_aarch64_cache_is_read_with_its_flags() {
    let cache = LdCache::parse(REAL).unwrap();
    let names: Vec<&str> = cache.entries().iter().map(|e| e.soname.as_str()).collect();
    assert_eq!(
        names,
        [
            "libpthread.so.0",
            "libm.so.6",
            "libgcc_s.so.1",
            "libdl.so.2",
            "libc.so.6",
            "ld-linux-aarch64.so.1"
        ]
    );
    for e in cache.entries() {
        // `libc6,AArch64`: FLAG_AARCH64_LIB64 | FLAG_ELF_LIBC6.
        assert_eq!(e.flags, 0x0a03, "{e:?}");
        assert_eq!(Arch::Aarch64.class_of(e.flags), Some(ElfClass::Lib64));
        // Not a library x86_64's loader would take.
        assert_eq!(Arch::X86_64.class_of(e.flags), None);
        assert!(e.path.starts_with(&format!("{LIB}/")), "{e:?}");
    }
    let libc = cache
        .lookup("libc.so.6", Arch::Aarch64, ElfClass::Lib64)
        .unwrap();
    assert_eq!(libc.path, format!("{LIB}/libc.so.6"));
    assert!(
        cache
            .lookup("libc.so.6", Arch::X86_64, ElfClass::Lib64)
            .is_none()
    );
    assert_eq!(ElfClass::Lib64.flags(Arch::Aarch64), 0x0a03);
    assert_eq!(ElfClass::Lib32.flags(Arch::Aarch64), 0x0903);
    assert_eq!(ElfClass::Lib64.flags(Arch::X86_64), 0x0303);
    assert_eq!(ElfClass::Lib32.flags(Arch::X86_64), 0x0003);
}

#[test]
fn driver_libraries_go_into_an_aarch64_cache() {
    let mut cache = LdCache::parse(REAL).unwrap();
    for soname in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        cache.insert(Entry::new(
            soname,
            format!("{LIB}/{soname}"),
            Arch::Aarch64,
            ElfClass::Lib64,
        ));
    }
    let bytes = cache.to_bytes().unwrap();
    // For a look with the real loader's tools: qemu-aarch64-static ldconfig -p -C FILE.
    std::fs::write(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("aarch64-written.cache"),
        &bytes,
    )
    .unwrap();
    let again = LdCache::parse(&bytes).unwrap();
    assert_eq!(again, cache);
    assert_eq!(again.entries().len(), 8);
    let cuda = again
        .lookup("libcuda.so.1", Arch::Aarch64, ElfClass::Lib64)
        .unwrap();
    assert_eq!(
        (cuda.path.as_str(), cuda.flags),
        ("/usr/lib/aarch64-linux-gnu/libcuda.so.1", 0x0a03)
    );
    // The loader binary-searches: entries stay in ldconfig's order.
    let names: Vec<&str> = again.entries().iter().map(|e| e.soname.as_str()).collect();
    assert_eq!(
        names[..3],
        ["libpthread.so.0", "libnvidia-ml.so.1", "libm.so.6"]
    );
}
