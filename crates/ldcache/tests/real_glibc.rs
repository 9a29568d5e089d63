//! The cache format against the real glibc on this machine: the host's own cache, glibc's
//! `ldconfig` reading what we write and writing what we read, and the real loader finding a
//! library through a cache we wrote. Needs `ldconfig`, `cc`, and root for `unshare -m`.
//! Entries are the build target's (`Arch::HOST`), which is what this machine's loader takes.

use nvhook_ldcache::{Arch, CacheFile, ElfClass, Entry, GENERATOR, HWCAP_EXTENSION, LdCache};
use std::path::Path;
use std::process::Command;

const HOST_CACHE: &str = "/etc/ld.so.cache";
const LDCONFIG: &str = "/sbin/ldconfig";

fn host_cache() -> LdCache {
    let file = std::fs::File::open(HOST_CACHE).expect("host ld.so.cache");
    LdCache::read_from(file).expect("host cache parses")
}

fn listing(cache: &LdCache) -> Vec<(String, String)> {
    cache
        .entries()
        .iter()
        .map(|e| (e.soname.clone(), e.path.clone()))
        .collect()
}

/// What `ldconfig -p -C FILE` prints: the count line, (soname, path) pairs, the rest.
struct Printed {
    count: usize,
    entries: Vec<(String, String)>,
    text: String,
}

fn ldconfig_print(cache: &Path) -> Printed {
    let out = Command::new(LDCONFIG)
        .arg("-p")
        .arg("-C")
        .arg(cache)
        .output()
        .expect("run ldconfig -p");
    let text = String::from_utf8(out.stdout).expect("ldconfig prints UTF-8");
    assert!(out.status.success(), "ldconfig -p failed: {text}");
    let count = text
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("count line");
    let entries = text
        .lines()
        .filter_map(|l| l.strip_prefix('\t'))
        .map(|l| {
            let (left, path) = l.split_once(" => ").expect("entry line");
            let (soname, _) = left.split_once(" (").expect("entry line");
            (soname.to_owned(), path.to_owned())
        })
        .collect();
    Printed {
        count,
        entries,
        text,
    }
}

fn write_cache(dir: &Path, name: &str, cache: &LdCache) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, cache.to_bytes().expect("serialise")).expect("write cache");
    path
}

/// Compiles a shared library whose SONAME is `soname` into `dir/soname`.
fn compile_library(dir: &Path, soname: &str) {
    let src = dir.join("nvhooktest.c");
    std::fs::write(&src, "int nvhook_test_value(void) { return 42; }\n").unwrap();
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
        .arg(dir.join(soname))
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed for {soname}");
}

/// The host's cache as ldconfig wrote it, read in place: the same cache, and for every name in
/// it the same entry found.
#[test]
fn the_host_cache_read_in_place_finds_what_the_parsed_cache_finds() {
    let bytes = std::fs::read(HOST_CACHE).expect("host ld.so.cache");
    let file = CacheFile::new(bytes).expect("host cache's header");
    let cache = host_cache();
    assert_eq!(file.parse().expect("host cache parses"), cache);
    assert!(cache.entries().len() > 10, "{cache:?}");
    for e in cache.entries() {
        for class in [ElfClass::Lib64, ElfClass::Lib32] {
            let expected = cache.lookup(&e.soname, Arch::HOST, class).cloned();
            let found = file
                .lookup(&e.soname, Arch::HOST, class)
                .expect("its entry reads");
            assert_eq!(found, expected, "{e:?}");
        }
    }
}

#[test]
fn host_cache_has_libc() {
    let cache = host_cache();
    let libc = cache
        .lookup("libc.so.6", Arch::HOST, ElfClass::Lib64)
        .expect("libc.so.6 in the host cache");
    let tuple = Arch::HOST.multiarch(ElfClass::Lib64);
    assert!(
        [
            format!("/lib/{tuple}/libc.so.6"),
            format!("/usr/lib/{tuple}/libc.so.6")
        ]
        .contains(&libc.path),
        "{libc:?}"
    );
    assert_eq!(Arch::HOST.class_of(libc.flags), Some(ElfClass::Lib64));
    let flags = if cfg!(target_arch = "aarch64") {
        0x0a03
    } else {
        0x0303
    };
    assert_eq!(libc.flags, flags);
    assert!(
        cache
            .lookup("libc.so.6", Arch::HOST, ElfClass::Lib32)
            .is_none()
    );
    assert!(
        cache
            .lookup("libnosuch.so.1", Arch::HOST, ElfClass::Lib64)
            .is_none()
    );
}

#[test]
fn host_cache_matches_ldconfig_listing() {
    // Same entries in the same order as Debian's ldconfig prints them: the parse is
    // right, and sorting with ldconfig_cmp left ldconfig's own order untouched.
    let printed = ldconfig_print(Path::new(HOST_CACHE));
    let cache = host_cache();
    assert_eq!(cache.entries().len(), printed.count);
    assert_eq!(listing(&cache), printed.entries);
}

#[test]
fn host_cache_round_trips() {
    let cache = host_cache();
    let bytes = cache.to_bytes().unwrap();
    let again = LdCache::parse(&bytes).unwrap();
    assert_eq!(again, cache);
    assert_eq!(again.to_bytes().unwrap(), bytes);
}

#[test]
fn ldconfig_reads_written_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mut cache = host_cache();
    let host_len = cache.entries().len();
    cache.set_hwcap_subdirs(vec!["x86-64-v2".into(), "x86-64-v3".into()]);
    for (soname, dir, class) in [
        ("libcuda.so.1", "drv32", ElfClass::Lib32),
        ("libcuda.so.1", "drv", ElfClass::Lib64),
        ("libnvidia-ml.so.1", "drv", ElfClass::Lib64),
        ("libnvx.so.10", "drv", ElfClass::Lib64),
        ("libnvx.so.2", "drv", ElfClass::Lib64),
    ] {
        cache.insert(Entry::new(
            soname,
            format!("/{dir}/{soname}"),
            Arch::HOST,
            class,
        ));
    }
    cache.insert(Entry {
        hwcap: HWCAP_EXTENSION | 1,
        ..Entry::new(
            "libnvx.so.2",
            "/opt/x86-64-v3/libnvx.so.2",
            Arch::HOST,
            ElfClass::Lib64,
        )
    });
    let file = write_cache(dir.path(), "ld.so.cache", &cache);

    let printed = ldconfig_print(&file);
    assert_eq!(printed.count, host_len + 6);
    assert_eq!(printed.entries, listing(&cache));
    let pos = |s: &str, p: &str| {
        let want = (s.to_owned(), p.to_owned());
        printed.entries.iter().position(|e| *e == want).unwrap()
    };
    // Descending names, numbers compared as numbers; 64-bit before 32-bit; the
    // glibc-hwcaps entry before the generic one of the same name.
    assert!(pos("libnvx.so.10", "/drv/libnvx.so.10") < pos("libnvx.so.2", "/drv/libnvx.so.2"));
    assert!(
        pos("libnvx.so.2", "/opt/x86-64-v3/libnvx.so.2") < pos("libnvx.so.2", "/drv/libnvx.so.2")
    );
    assert!(pos("libcuda.so.1", "/drv/libcuda.so.1") < pos("libcuda.so.1", "/drv32/libcuda.so.1"));
    assert!(
        printed
            .text
            .contains("libcuda.so.1 (libc6) => /drv32/libcuda.so.1")
    );
    assert!(
        printed.text.contains("hwcap: \"x86-64-v3\""),
        "{}",
        printed.text
    );
    assert!(
        printed
            .text
            .contains(&format!("Cache generated by: {GENERATOR}"))
    );
}

#[test]
fn order_and_formats_match_real_ldconfig() {
    // ldconfig itself builds caches (old, compat and new formats) over libraries with
    // awkward names; each must parse to ldconfig's own listing, and inserting the same
    // entries into an empty cache, in any order, must give that same order.
    let root = tempfile::tempdir().unwrap();
    let lib = root.path().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::create_dir_all(root.path().join("etc")).unwrap();
    std::fs::write(root.path().join("etc/ld.so.conf"), "").unwrap();
    let sonames = [
        "libnvx.so.1",
        "libnvx.so.10",
        "libnvx.so.2",
        "libnvx.so.1.5",
        "libnvx-a.so.1",
        "libnvx_b.so.1",
        "libNvx.so.1",
        "libnvx9.so",
        "libnvx.so",
    ];
    for soname in sonames {
        compile_library(&lib, soname);
    }
    let mut ours = LdCache::default();
    for soname in sonames.iter().rev() {
        ours.insert(Entry::new(
            *soname,
            format!("/lib/{soname}"),
            Arch::HOST,
            ElfClass::Lib64,
        ));
    }
    for format in ["old", "compat", "new"] {
        let status = Command::new(LDCONFIG)
            .arg("-r")
            .arg(root.path())
            .args(["-X", "-c", format, "-C", &format!("/etc/{format}.cache")])
            .status()
            .expect("run ldconfig");
        assert!(status.success(), "ldconfig -c {format}");
        let file = root.path().join(format!("etc/{format}.cache"));
        let parsed = LdCache::parse(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(listing(&parsed), ldconfig_print(&file).entries, "{format}");
        assert_eq!(listing(&parsed), listing(&ours), "{format}");
    }
}

/// Runs `prog` in a private mount namespace whose /etc/ld.so.cache is `cache`, the only
/// way to make the real loader read a cache we wrote.
fn run_with_cache(cache: &Path, prog: &Path) -> std::process::Output {
    Command::new("/usr/bin/unshare")
        .args(["-m", "--propagation", "private", "/bin/sh", "-c"])
        .arg("mount --bind \"$1\" /etc/ld.so.cache && exec \"$2\"")
        .arg("sh")
        .arg(cache)
        .arg(prog)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .expect("run unshare")
}

#[test]
fn loader_finds_library_through_written_cache() {
    let dir = tempfile::tempdir().unwrap();
    compile_library(dir.path(), "libnvhooktest.so.1");
    let prog_src = dir.path().join("prog.c");
    std::fs::write(
        &prog_src,
        r#"#include <dlfcn.h>
#include <stdio.h>
int main(void) {
void *h = dlopen("libnvhooktest.so.1", RTLD_NOW);
if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
int (*f)(void) = (int (*)(void)) dlsym(h, "nvhook_test_value");
if (!f || f() != 42) return 2;
puts("loaded");
return 0;
}
"#,
    )
    .unwrap();
    let prog = dir.path().join("prog");
    let status = Command::new("cc")
        .arg("-o")
        .arg(&prog)
        .arg(&prog_src)
        .status()
        .expect("run cc");
    assert!(status.success());

    let mut cache = host_cache();
    let without = write_cache(dir.path(), "without.cache", &cache);
    let lib = dir.path().join("libnvhooktest.so.1");
    cache.insert(Entry::new(
        "libnvhooktest.so.1",
        lib.to_str().unwrap(),
        Arch::HOST,
        ElfClass::Lib64,
    ));
    let with = write_cache(dir.path(), "with.cache", &cache);

    let out = run_with_cache(&with, &prog);
    assert!(
        out.status.success(),
        "dlopen through our cache failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"loaded\n");

    let out = run_with_cache(&without, &prog);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("libnvhooktest.so.1"));
}
