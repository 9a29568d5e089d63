//! `nvhook configure`, end to end: the real binary on copies of realistic engine configs in
//! temporary directories. Expected outputs live in tests/golden/configure; after an
//! intended change, regenerate them with `NVHOOK_BLESS=1 cargo test --test configure`
//! and review the diff.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use nvhook_test_support as support;
use support::run_nvhook;

const RUNTIME: &str = "/usr/bin/nvhook-runtime";

fn golden_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/configure")
        .join(name)
}

fn golden(name: &str) -> String {
    fs::read_to_string(golden_path(name)).unwrap_or_else(|e| panic!("golden {name}: {e}"))
}

fn assert_golden(actual: &str, name: &str) {
    if std::env::var_os("NVHOOK_BLESS").is_some() {
        fs::write(golden_path(name), actual).unwrap();
    }
    assert_eq!(actual, golden(name), "output differs from golden {name}");
}

/// Runs `nvhook configure ENGINE --engine-config FILE EXTRA...`, which must succeed, and
/// returns its stdout.
fn configure(engine: &str, file: &Path, extra: &[&str]) -> String {
    let file = file.to_str().unwrap();
    // The goldens name the packaged runtime, which need not be installed here.
    let runtime: &[&str] = match extra.contains(&"--runtime-path") {
        true => &["--allow-missing"],
        false => &["--runtime-path", RUNTIME, "--allow-missing"],
    };
    let out = run_nvhook(
        &[
            &["configure", engine, "--engine-config", file],
            extra,
            runtime,
        ]
        .concat(),
    );
    assert!(
        out.status.success(),
        "nvhook configure {engine} {extra:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A temporary directory holding a copy of a golden input under `name`.
fn copy_of(input: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    fs::write(&file, golden(input)).unwrap();
    (dir, file)
}

fn backup_of(file: &Path) -> PathBuf {
    PathBuf::from(format!("{}.nvhook.bak", file.display()))
}

fn read(file: &Path) -> String {
    fs::read_to_string(file).unwrap()
}

/// Every input the engines are tested on: (engine, golden input, file name).
const INPUTS: [(&str, &str, &str); 5] = [
    ("containerd", "containerd-v2-default.toml", "config.toml"),
    ("containerd", "containerd-debian.toml", "config.toml"),
    ("containerd", "containerd-v3-no-imports.toml", "config.toml"),
    ("docker", "docker-canonical.json", "daemon.json"),
    ("crio", "crio-main.conf", "crio.conf"),
];

#[test]
fn containerd_v2_default_config() {
    let (_dir, file) = copy_of("containerd-v2-default.toml", "config.toml");
    let stdout = configure("containerd", &file, &[]);
    assert!(stdout.contains("systemctl restart containerd"), "{stdout}");
    assert_golden(&read(&file), "containerd-v2-default.configured.toml");
    assert_eq!(
        read(&backup_of(&file)),
        golden("containerd-v2-default.toml")
    );
}

#[test]
fn containerd_debian_config_without_runtimes_keeps_runc() {
    let (_dir, file) = copy_of("containerd-debian.toml", "config.toml");
    configure("containerd", &file, &["--set-as-default"]);
    assert_golden(&read(&file), "containerd-debian.default.toml");
}

#[test]
fn containerd_v3_config_without_imports_is_edited_itself() {
    let (dir, file) = copy_of("containerd-v3-no-imports.toml", "config.toml");
    configure("containerd", &file, &["--set-as-default"]);
    assert_golden(&read(&file), "containerd-v3.default.toml");
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        2,
        "config and backup only"
    );
}

// ---- containerd 2: the runtime in a drop-in the main config imports ----

/// containerd 2 configs that import a drop-in directory: (golden input, how the copy names
/// the directory: `abs` for an absolute path into the test's directory, else relative).
const DROP_IN_INPUTS: [(&str, &str); 2] = [
    // containerd 2.3's own `containerd config default`: version 4.
    ("containerd-2.3-default.toml", "conf.d/*.toml"),
    ("containerd-v3.toml", "abs"),
];

/// A node's containerd directory: `config.toml`, a copy of `input` whose imports name the
/// test's own `conf.d` (the host's `/etc/containerd/conf.d` must stay untouched), and where
/// nvhook's drop-in goes.
struct Containerd2 {
    dir: tempfile::TempDir,
    main: PathBuf,
    original: String,
}

impl Containerd2 {
    fn new(input: &str, import: &str) -> Containerd2 {
        let dir = tempfile::tempdir().unwrap();
        let import = match import {
            "abs" => format!("{}/conf.d/*.toml", dir.path().display()),
            relative => relative.to_owned(),
        };
        let original = golden(input).replace("/etc/containerd/conf.d/*.toml", &import);
        assert_ne!(
            original,
            golden(input),
            "{input} imports /etc/containerd/conf.d"
        );
        let main = dir.path().join("config.toml");
        fs::write(&main, &original).unwrap();
        Containerd2 {
            dir,
            main,
            original,
        }
    }

    fn drop_in(&self) -> PathBuf {
        self.dir.path().join("conf.d/99-nvhook.toml")
    }
}

#[test]
fn containerd_2_gets_a_drop_in_and_its_main_config_stays_as_it_was() {
    for (input, import) in DROP_IN_INPUTS {
        for (extra, expected) in [
            (&[][..], "drop-in"),
            (&["--set-as-default"][..], "drop-in.default"),
        ] {
            let node = Containerd2::new(input, import);
            let stdout = configure("containerd", &node.main, extra);
            let drop_in = node.drop_in();
            assert_eq!(
                stdout,
                format!(
                    "configured runtime \"nvidia\" in {}\nto apply it: systemctl restart containerd\n",
                    drop_in.display()
                ),
                "{input} {extra:?}"
            );
            let name = input.replace(".toml", &format!(".{expected}.toml"));
            assert_golden(&read(&drop_in), &name);
            assert_eq!(
                read(&node.main),
                node.original,
                "{input}: main config untouched"
            );
            assert!(
                !backup_of(&node.main).exists(),
                "{input}: main config not rewritten"
            );

            let again = configure("containerd", &node.main, extra);
            assert!(again.starts_with("already configured:"), "{again}");
            assert_eq!(read(&drop_in), golden(&name), "{input}: second run");

            let removed = configure("containerd", &node.main, &["--remove"]);
            assert!(
                removed.starts_with(&format!(
                    "removed runtime \"nvidia\" from {}",
                    drop_in.display()
                )),
                "{removed}"
            );
            assert!(!drop_in.exists(), "{input}: the drop-in is retired");
            assert_eq!(read(&node.main), node.original, "{input}: after --remove");
            let again = configure("containerd", &node.main, &["--remove"]);
            assert!(again.starts_with("not configured:"), "{again}");
        }
    }
}

#[test]
fn containerd_2_drop_in_dry_run_writes_nothing() {
    let node = Containerd2::new("containerd-2.3-default.toml", "conf.d/*.toml");
    let stdout = configure("containerd", &node.main, &["--dry-run"]);
    let drop_in = node.drop_in();
    assert!(
        stdout.starts_with(&format!("--- /dev/null\n+++ {}\n", drop_in.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("+BinaryName = '{RUNTIME}'\n")),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(&format!("dry run: {} not written\n", drop_in.display())),
        "{stdout}"
    );
    assert!(!drop_in.parent().unwrap().exists());
    assert_eq!(read(&node.main), node.original);
}

#[test]
fn containerd_2_without_imports_and_containerd_1_with_them_edit_the_main_config() {
    // containerd 2.3's default less its imports line: the runtime goes into the file itself.
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("config.toml");
    let default = golden("containerd-2.3-default.toml");
    let without: String = default
        .lines()
        .filter(|l| !l.starts_with("imports"))
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(&main, &without).unwrap();
    configure("containerd", &main, &[]);
    assert_golden(
        &read(&main),
        "containerd-2.3-default.no-imports.configured.toml",
    );
    assert!(!dir.path().join("conf.d").exists());
    configure("containerd", &main, &["--remove"]);
    assert_eq!(read(&main), without);

    // containerd 1 replaces a whole plugin section from an import: no drop-in for version 2.
    let (dir, main) = copy_of("containerd-v2-default.toml", "config.toml");
    let with_imports = golden("containerd-v2-default.toml")
        .replace("imports = []", "imports = [\"conf.d/*.toml\"]");
    fs::write(&main, &with_imports).unwrap();
    configure("containerd", &main, &[]);
    assert!(read(&main).contains("runtimes.nvidia]"), "{}", read(&main));
    assert!(!dir.path().join("conf.d").exists());
}

#[test]
fn containerd_2_remove_also_cleans_a_runtime_an_earlier_nvhook_put_in_the_main_config() {
    let node = Containerd2::new("containerd-v3.toml", "abs");
    // What nvhook wrote before it knew drop-ins: the runtime in the main file.
    let imports_line = node
        .original
        .lines()
        .find(|l| l.starts_with("imports"))
        .unwrap()
        .to_owned();
    fs::write(&node.main, node.original.replace(&imports_line, "")).unwrap();
    configure("containerd", &node.main, &["--set-as-default"]);
    let old_style = read(&node.main).replacen("\n", &format!("\n{imports_line}\n"), 1);
    fs::write(&node.main, &old_style).unwrap();
    assert!(old_style.contains("runtimes.nvidia]"));

    let stdout = configure("containerd", &node.main, &["--remove"]);
    assert!(
        stdout.starts_with(&format!(
            "removed runtime \"nvidia\" from {}",
            node.main.display()
        )),
        "{stdout}"
    );
    let after = read(&node.main);
    assert!(!after.contains("nvidia"), "{after}");
    assert!(after.contains("default_runtime_name = 'runc'"), "{after}");
    assert!(!node.drop_in().exists());
}

#[test]
fn containerd_2_bad_imports_or_drop_in_is_one_line_and_nothing_is_written() {
    let node = Containerd2::new("containerd-2.3-default.toml", "conf.d/*.toml");
    let drop_in = node.drop_in();
    fs::create_dir_all(drop_in.parent().unwrap()).unwrap();
    fs::write(&drop_in, "version = 3\n[plugins\n").unwrap();
    let bad_imports = node
        .original
        .replace("imports = ['conf.d/*.toml']", "imports = 3");
    for (file, text, expected) in [
        (
            &drop_in,
            "version = 3\n[plugins\n",
            "not valid TOML at line 2",
        ),
        (
            &node.main,
            bad_imports.as_str(),
            "`imports = 3` is not an array of paths",
        ),
    ] {
        fs::write(file, text).unwrap();
        let out = run_nvhook(&[
            "configure",
            "containerd",
            "--engine-config",
            node.main.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(expected) && stderr.contains(file.to_str().unwrap()),
            "{stderr}"
        );
        assert_eq!(read(file), text);
        assert!(!backup_of(file).exists());
    }
}

#[test]
fn containerd_missing_file_is_created_as_version_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etc/containerd/config.toml");
    // Away from /etc/containerd, configure makes no directory (see
    // `an_engine_config_in_a_directory_that_is_not_there_is_refused`).
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    configure("containerd", &file, &[]);
    assert_golden(&read(&file), "containerd-new.toml");
    assert!(
        !backup_of(&file).exists(),
        "no backup of a file that did not exist"
    );
}

/// k3s's and RKE2's containerd templates hold Go template directives: nvhook adds its block
/// and takes it out as text, and every other byte stays.
#[test]
fn k3s_and_rke2_templates_get_a_block_and_keep_every_other_byte() {
    for (engine, name, expected) in [
        ("k3s", "config.toml.tmpl", "k3s-config.toml.configured.tmpl"),
        (
            "rke2",
            "config-v3.toml.tmpl",
            "k3s-config-v3.toml.configured.tmpl",
        ),
    ] {
        let (dir, file) = copy_of("k3s-config.toml.tmpl", name);
        let stdout = configure(engine, &file, &[]);
        assert!(stdout.contains("systemctl restart"), "{stdout}");
        assert_golden(&read(&file), expected);
        let again = configure(engine, &file, &[]);
        assert!(again.starts_with("already configured:"), "{again}");
        configure(engine, &file, &["--remove"]);
        assert_eq!(read(&file), golden("k3s-config.toml.tmpl"), "{engine}");

        // No template yet: k3s's base, then the block; --remove leaves k3s its default.
        let new = dir.path().join("new").join(name);
        fs::create_dir(dir.path().join("new")).unwrap();
        configure(engine, &new, &[]);
        assert!(
            read(&new).starts_with("{{ template \"base\" . }}\n"),
            "{}",
            read(&new)
        );
        configure(engine, &new, &["--remove"]);
        assert!(
            !new.exists(),
            "{engine}: a template with only the base is retired"
        );

        let out = run_nvhook(&[
            "configure",
            engine,
            "--engine-config",
            file.to_str().unwrap(),
            "--set-as-default",
        ]);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("--default-runtime"), "{stderr}");
        assert_eq!(read(&file), golden("k3s-config.toml.tmpl"));
    }
}

#[test]
fn docker_daemon_json_keeps_other_keys_and_their_order() {
    let (_dir, file) = copy_of("docker-daemon.json", "daemon.json");
    let stdout = configure("docker", &file, &["--set-as-default"]);
    assert!(stdout.contains("systemctl restart docker"), "{stdout}");
    assert_golden(&read(&file), "docker-daemon.default.json");
}

#[test]
fn crio_drop_in_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("crio.conf.d/99-nvidia.conf");
    fs::create_dir(file.parent().unwrap()).unwrap();
    let stdout = configure("crio", &file, &["--set-as-default"]);
    assert!(stdout.contains("systemctl restart crio"), "{stdout}");
    assert_golden(&read(&file), "crio-99-nvidia.default.conf");
}

/// A typo'd `--engine-config` (a directory that is not there) would configure a file the
/// engine never reads: refused in one line, exit 2 (a flag's value), and nothing made, for
/// every engine and every kind of run. Only an engine's default location may lack its
/// directory (unit-tested in src/configure).
#[test]
fn an_engine_config_in_a_directory_that_is_not_there_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nonexistent/dir");
    let defaults = [
        ("docker", "daemon.json", "/etc/docker/daemon.json"),
        ("containerd", "config.toml", "/etc/containerd/config.toml"),
        (
            "crio",
            "99-nvidia.conf",
            "/etc/crio/crio.conf and the drop-ins in /etc/crio/crio.conf.d",
        ),
        (
            "k3s",
            "config.toml.tmpl",
            "the template in /var/lib/rancher/k3s/agent/etc/containerd",
        ),
        (
            "rke2",
            "config.toml.tmpl",
            "the template in /var/lib/rancher/rke2/agent/etc/containerd",
        ),
    ];
    for (engine, name, default) in defaults {
        let file = missing.join(name);
        let expected = format!(
            "nvhook: --engine-config {file}: no directory {dir}, so {engine} reads no config there; nothing written: name the file {engine} reads (by default {default}), or mkdir -p {dir} first if {engine} is set up to read its config there\n",
            file = file.display(),
            dir = missing.display(),
        );
        let runtime: &[&str] = &["--runtime-path", RUNTIME, "--allow-missing"];
        let mut runs: Vec<Vec<&str>> = vec![
            runtime.to_vec(),
            [runtime, &["--dry-run"]].concat(),
            vec!["--remove"],
        ];
        if matches!(engine, "containerd" | "crio") {
            runs.push(vec!["--nri"]);
            runs.push(vec!["--nri", "--remove"]);
        }
        for extra in runs {
            let file_arg = file.to_str().unwrap();
            let args = [
                &["configure", engine, "--engine-config", file_arg][..],
                &extra,
            ]
            .concat();
            let out = run_nvhook(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{engine} {extra:?}: {stderr}");
            assert_eq!(stderr, expected, "{engine} {extra:?}");
            assert!(
                out.stdout.is_empty(),
                "{engine} {extra:?}: said it did something"
            );
            assert!(
                !dir.path().join("nonexistent").exists(),
                "{engine} {extra:?}: made the directory"
            );
        }
    }
    // The issue's own command line (a typo'd directory), with the runtime beside this nvhook.
    let scratch = tempfile::tempdir().unwrap();
    let typo = scratch.path().join("nonexistent");
    let file = typo.join("dir/daemon.json");
    let out = run_nvhook(&[
        "configure",
        "docker",
        "--engine-config",
        file.to_str().unwrap(),
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "nvhook: --engine-config {file}: no directory {dir}, so docker reads no config there; nothing written: name the file docker reads (by default /etc/docker/daemon.json), or mkdir -p {dir} first if docker is set up to read its config there\n",
            file = file.display(),
            dir = typo.join("dir").display()
        )
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(!typo.exists());
}

#[test]
fn custom_runtime_name_and_path() {
    let (_dir, file) = copy_of("docker-canonical.json", "daemon.json");
    configure(
        "docker",
        &file,
        &[
            "--runtime-name",
            "gpu",
            "--runtime-path",
            "/opt/nvhook/bin/nvhook-runtime",
        ],
    );
    let config: serde_json::Value = serde_json::from_str(&read(&file)).unwrap();
    assert_eq!(
        config["runtimes"]["gpu"]["path"],
        "/opt/nvhook/bin/nvhook-runtime"
    );
}

#[test]
fn a_second_run_changes_nothing() {
    for (engine, input, name) in INPUTS {
        for extra in [&[][..], &["--set-as-default"]] {
            let (_dir, file) = copy_of(input, name);
            configure(engine, &file, extra);
            let once = read(&file);
            let stdout = configure(engine, &file, extra);
            assert_eq!(
                stdout.trim(),
                format!("already configured: {} unchanged", file.display()),
                "{engine} {input} {extra:?}"
            );
            assert_eq!(read(&file), once, "{engine} {input} {extra:?}");
            assert_eq!(
                read(&backup_of(&file)),
                golden(input),
                "backup still the original"
            );
        }
    }
}

#[test]
fn remove_restores_the_original_byte_for_byte() {
    for (engine, input, name) in INPUTS {
        for extra in [&[][..], &["--set-as-default"]] {
            let (_dir, file) = copy_of(input, name);
            configure(engine, &file, extra);
            assert_ne!(read(&file), golden(input));
            let stdout = configure(engine, &file, &["--remove"]);
            assert!(stdout.starts_with("removed runtime \"nvidia\""), "{stdout}");
            assert_eq!(read(&file), golden(input), "{engine} {input} {extra:?}");
            let again = configure(engine, &file, &["--remove"]);
            assert!(again.starts_with("not configured:"), "{again}");
        }
    }
}

#[test]
fn remove_takes_away_a_file_that_configure_created() {
    for (engine, name) in [("crio", "99-nvidia.conf"), ("docker", "daemon.json")] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        configure(engine, &file, &["--set-as-default"]);
        configure(engine, &file, &["--remove"]);
        assert!(!file.exists(), "{engine}: {}", file.display());
    }
}

#[test]
fn remove_keeps_a_default_runtime_that_is_not_ours() {
    let (_dir, file) = copy_of("containerd-v2-default.toml", "config.toml");
    configure("containerd", &file, &["--set-as-default"]);
    let edited = read(&file).replace(
        "default_runtime_name = \"nvidia\"",
        "default_runtime_name = \"kata\"",
    );
    fs::write(&file, &edited).unwrap();
    configure("containerd", &file, &["--remove"]);
    let after = read(&file);
    assert!(after.contains("default_runtime_name = \"kata\""), "{after}");
    assert!(!after.contains("runtimes.nvidia"), "{after}");
}

#[test]
fn dry_run_prints_a_diff_and_writes_nothing() {
    let (dir, file) = copy_of("containerd-v2-default.toml", "config.toml");
    let stdout = configure("containerd", &file, &["--dry-run", "--set-as-default"]);
    let path = file.display();
    assert!(
        stdout.starts_with(&format!("--- {path}\n+++ {path}\n@@ ")),
        "{stdout}"
    );
    assert!(
        stdout.contains("\n-      default_runtime_name = \"runc\"\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("\n+            BinaryName = \"{RUNTIME}\"\n")),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(&format!("dry run: {path} not written\n")),
        "{stdout}"
    );
    assert_eq!(read(&file), golden("containerd-v2-default.toml"));
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no backup, no temp file"
    );

    let missing = dir.path().join("crio.conf.d/99-nvidia.conf");
    fs::create_dir(missing.parent().unwrap()).unwrap();
    let stdout = configure("crio", &missing, &["--dry-run"]);
    assert!(stdout.starts_with("--- /dev/null\n"), "{stdout}");
    assert!(!missing.exists());
}

#[test]
fn unparseable_file_is_an_error_naming_it_and_is_left_untouched() {
    for (engine, name, garbage, expected) in [
        (
            "containerd",
            "config.toml",
            "version = 2\n[plugins\n",
            "not valid TOML at line 2",
        ),
        (
            "crio",
            "99-nvidia.conf",
            "[crio.runtime\n",
            "not valid TOML at line 1",
        ),
        (
            "docker",
            "daemon.json",
            "{\"runtimes\": {,}}\n",
            "not valid JSON",
        ),
        ("docker", "daemon.json", "[]\n", "not a JSON object"),
        (
            "containerd",
            "config.toml",
            "version = 7\n",
            "unsupported `version = 7`",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(name);
        fs::write(&file, garbage).unwrap();
        let file_arg = file.to_str().unwrap();
        let out = run_nvhook(&["configure", engine, "--engine-config", file_arg]);
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(!out.status.success(), "{engine} accepted {garbage:?}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(file_arg), "{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert_eq!(read(&file), garbage);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "{stderr}");
    }
}

#[test]
fn nvhooks_own_config_flag_is_not_taken_for_the_engines() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("daemon.json");
    let out = run_nvhook(&[
        "--config",
        file.to_str().unwrap(),
        "configure",
        "docker",
        "--dry-run",
    ]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success());
    assert!(stderr.contains("--engine-config"), "{stderr}");
}

#[test]
fn a_relative_runtime_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("daemon.json");
    let file_arg = file.to_str().unwrap();
    let out = run_nvhook(&[
        "configure",
        "docker",
        "--engine-config",
        file_arg,
        "--runtime-path",
        "nvhook-runtime",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not absolute"));
    assert!(!file.exists());
}

/// containerd itself must read what configure wrote, with our runtime in it and runc kept.
#[test]
fn real_containerd_accepts_the_result() {
    // containerd 1.x reads a file without `version` as version 1 (CRI plugin id `cri`).
    let version_1 = "[plugins.cri]\n  sandbox_image = \"registry.k8s.io/pause:3.6\"\n";
    let inputs = [
        ("v2 default", golden("containerd-v2-default.toml")),
        ("debian", golden("containerd-debian.toml")),
        ("v1", version_1.to_owned()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    for (input, text) in inputs {
        fs::write(&file, text).unwrap();
        configure("containerd", &file, &["--set-as-default"]);
        let out = Command::new("containerd")
            .arg("--config")
            .arg(&file)
            .args(["config", "dump"])
            .output()
            .expect("containerd must be installed for this test (apt-get install containerd)");
        let dump = String::from_utf8(out.stdout).unwrap();
        assert!(
            out.status.success(),
            "{input}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cri = "[plugins.\"io.containerd.grpc.v1.cri\".containerd";
        let nvidia_options =
            format!("{cri}.runtimes.nvidia.options]\n            BinaryName = \"{RUNTIME}\"\n");
        assert!(dump.contains(&nvidia_options), "{input}:\n{dump}");
        assert!(
            dump.contains(&format!("{cri}.runtimes.runc]")),
            "{input}: runc lost:\n{dump}"
        );
        assert!(
            dump.contains("default_runtime_name = \"nvidia\""),
            "{input}:\n{dump}"
        );
    }
}

/// The hooks.d file for Podman / CRI-O: containers/common's schema 1.0.0, and the rules
/// nvhook keeps for every hook entry (absolute path, explicit env, a timeout).
#[test]
fn oci_hook_file_follows_the_hooks_d_schema() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/oci-nvhook-hook.json");
    let hook: serde_json::Value = serde_json::from_str(&read(&path)).unwrap();
    assert_eq!(hook["version"], "1.0.0");
    assert_eq!(hook["hook"]["path"], "/usr/bin/nvhook");
    assert_eq!(
        hook["hook"]["args"],
        serde_json::json!(["nvhook", "hook", "prestart"])
    );
    assert_eq!(
        hook["hook"]["env"],
        serde_json::json!(["PATH=/usr/sbin:/usr/bin:/sbin:/bin"])
    );
    assert!(hook["hook"]["timeout"].as_u64().is_some_and(|t| t > 0));
    assert_eq!(hook["when"], serde_json::json!({"always": true}));
    assert_eq!(hook["stages"], serde_json::json!(["prestart"]));
    let keys: Vec<_> = hook.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["version", "hook", "when", "stages"],
        "no unknown fields"
    );
}

// ---- --kubernetes: nvhook's own config gets the hardened device-selection policy ----

/// A containerd config and an nvhook config, copies of golden inputs, in one directory.
fn kubernetes_node() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let (dir, containerd) = copy_of("containerd-v2-default.toml", "config.toml");
    let nvhook_config = dir.path().join("nvhook.toml");
    fs::write(&nvhook_config, golden("nvhook-config.toml")).unwrap();
    (dir, containerd, nvhook_config)
}

fn kubernetes_args(nvhook_config: &Path) -> Vec<&str> {
    vec!["--kubernetes", "--config", nvhook_config.to_str().unwrap()]
}

/// With no --config, --kubernetes writes the file `$NVHOOK_CONFIG` names, as every command
/// reads it; `--nvhook-config` is gone (one flag names nvhook's config).
#[test]
fn kubernetes_writes_the_config_nvhook_config_names() {
    let (_dir, containerd, nvhook_config) = kubernetes_node();
    let out = std::process::Command::new(nvhook_test_support::nvhook_bin())
        .args(["configure", "containerd", "--engine-config"])
        .arg(&containerd)
        .args(["--kubernetes", "--runtime-path", RUNTIME, "--allow-missing"])
        .env("NVHOOK_CONFIG", &nvhook_config)
        .output()
        .expect("run nvhook");
    assert!(out.status.success(), "{out:?}");
    assert_golden(&read(&nvhook_config), "nvhook-config.kubernetes.toml");
    let old = run_nvhook(&[
        "configure",
        "containerd",
        "--engine-config",
        containerd.to_str().unwrap(),
        "--kubernetes",
        "--nvhook-config",
        nvhook_config.to_str().unwrap(),
    ]);
    assert_eq!(old.status.code(), Some(2));
}

#[test]
fn kubernetes_sets_the_policy_and_registers_the_runtime() {
    let (_dir, containerd, nvhook_config) = kubernetes_node();
    let stdout = configure("containerd", &containerd, &kubernetes_args(&nvhook_config));
    let policy = format!("set the Kubernetes policy in {}", nvhook_config.display());
    assert!(stdout.starts_with(&policy), "{stdout}");
    assert!(
        stdout.contains("accept-env-when-unprivileged = false"),
        "{stdout}"
    );
    assert!(stdout.contains("systemctl restart containerd"), "{stdout}");
    assert_golden(&read(&nvhook_config), "nvhook-config.kubernetes.toml");
    assert_eq!(
        read(&backup_of(&nvhook_config)),
        golden("nvhook-config.toml")
    );
    // The engine's part is exactly what configure writes without --kubernetes.
    assert_eq!(
        read(&containerd),
        golden("containerd-v2-default.configured.toml")
    );

    let again = configure("containerd", &containerd, &kubernetes_args(&nvhook_config));
    assert_eq!(
        again,
        format!(
            "Kubernetes policy already set: {} unchanged\nalready configured: {} unchanged\n",
            nvhook_config.display(),
            containerd.display()
        )
    );
}

#[test]
fn kubernetes_creates_a_missing_nvhook_config() {
    let dir = tempfile::tempdir().unwrap();
    let containerd = dir.path().join("containerd/config.toml");
    fs::create_dir(containerd.parent().unwrap()).unwrap();
    let nvhook_config = dir.path().join("nvhook/config.toml");
    configure("containerd", &containerd, &kubernetes_args(&nvhook_config));
    assert_golden(&read(&nvhook_config), "nvhook-config.new-kubernetes.toml");
    assert!(!backup_of(&nvhook_config).exists());
}

#[test]
fn kubernetes_dry_run_shows_both_changes_and_writes_nothing() {
    let (dir, containerd, nvhook_config) = kubernetes_node();
    let mut args = kubernetes_args(&nvhook_config);
    args.push("--dry-run");
    let stdout = configure("containerd", &containerd, &args);
    let nvhook_path = nvhook_config.display();
    assert!(
        stdout.starts_with(&format!("--- {nvhook_path}\n+++ {nvhook_path}\n@@ ")),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "\n-accept-env-when-unprivileged = true\n+accept-env-when-unprivileged = false\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("dry run: {nvhook_path} not written\n--- ")),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(&format!("dry run: {} not written\n", containerd.display())),
        "{stdout}"
    );
    assert_eq!(read(&nvhook_config), golden("nvhook-config.toml"));
    assert_eq!(read(&containerd), golden("containerd-v2-default.toml"));
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2, "nothing new");
}

#[test]
fn kubernetes_with_a_bad_nvhook_config_writes_neither_file() {
    for (garbage, expected) in [
        ("accept-env-when-unprivileged = \"no\"\n", "line 1"),
        ("accept-env = false\n", "accept-env"),
        ("[x\n", "line 1: unclosed table"),
    ] {
        let (dir, containerd, nvhook_config) = kubernetes_node();
        fs::write(&nvhook_config, garbage).unwrap();
        let out = run_nvhook(
            &[
                &["configure", "containerd", "--engine-config"],
                &[containerd.to_str().unwrap()][..],
                &kubernetes_args(&nvhook_config),
            ]
            .concat(),
        );
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(!out.status.success(), "{garbage:?} accepted");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(nvhook_config.to_str().unwrap()), "{stderr}");
        assert!(stderr.contains(expected), "{garbage:?}: {stderr}");
        assert!(
            stderr.contains("name another file with --config"),
            "{stderr}"
        );
        assert_eq!(read(&nvhook_config), garbage);
        assert_eq!(read(&containerd), golden("containerd-v2-default.toml"));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2, "{stderr}");
    }
}

#[test]
fn remove_keeps_the_kubernetes_policy() {
    let (_dir, containerd, nvhook_config) = kubernetes_node();
    configure("containerd", &containerd, &kubernetes_args(&nvhook_config));
    let hardened = read(&nvhook_config);

    let mut args = vec!["--remove"];
    args.extend(kubernetes_args(&nvhook_config));
    let out = run_nvhook(
        &[
            &["configure", "containerd", "--engine-config"],
            &[containerd.to_str().unwrap()][..],
            &args,
        ]
        .concat(),
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("leaves the hardened policy"), "{stderr}");

    configure("containerd", &containerd, &["--remove"]);
    assert_eq!(read(&containerd), golden("containerd-v2-default.toml"));
    assert_eq!(read(&nvhook_config), hardened);
}

#[test]
fn nvhook_config_without_kubernetes_is_a_usage_error() {
    let out = run_nvhook(&[
        "configure",
        "containerd",
        "--config",
        "/etc/nvhook/config.toml",
        "--dry-run",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kubernetes"));
}

// ---- --nri: the engine's NRI on, for `nvhook nri`; no runtime ----

/// `nvhook configure ENGINE --nri --engine-config FILE EXTRA...`: its exit status, stdout
/// and stderr, with a containerd 1.7 first on PATH (configure asks it whether it has NRI).
fn configure_nri(engine: &str, file: &Path, extra: &[&str]) -> (i32, String, String) {
    let bin = tempfile::tempdir().unwrap();
    nvhook_test_support::containerd_1_7_in(bin.path());
    configure_nri_with(engine, file, extra, &before_path(bin.path()))
}

/// `dir`, then this process's PATH.
fn before_path(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// [`configure_nri`] with `path` as PATH.
fn configure_nri_with(
    engine: &str,
    file: &Path,
    extra: &[&str],
    path: &str,
) -> (i32, String, String) {
    let file = file.to_str().unwrap();
    let out = std::process::Command::new(nvhook_test_support::nvhook_bin())
        .args(["configure", engine, "--nri", "--engine-config", file])
        .args(extra)
        .env_remove("NVHOOK_CONFIG")
        .env("PATH", path)
        .output()
        .expect("run nvhook");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap(),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// containerd 1.6 has no NRI: `--nri` is refused whatever its config says, naming the upgrade
/// and the runtime path, and the file is left as it is (Debian 12's containerd 1.6.20, the
/// one on PATH); Debian sid's 2.1.9 is taken; with no containerd to ask, a config without an
/// NRI table is refused too.
#[test]
fn nri_is_refused_for_a_containerd_without_nri() {
    let debian = nvhook_test_support::engines::ContainerdBuild::debian();
    assert!(debian.version().contains("1.6"), "{}", debian.version());
    let (_dir, file) = copy_of("containerd-1.7-default.toml", "config.toml");
    let dir_of = |program: PathBuf| program.parent().unwrap().to_path_buf();
    let (code, out, err) = configure_nri_with(
        "containerd",
        &file,
        &[],
        &before_path(&dir_of(debian.program("containerd"))),
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.is_empty(), "{out}");
    // Debian 12's says `containerd github.com/containerd/containerd 1.6.20~ds1 ...`.
    assert!(err.starts_with("nvhook: containerd 1.6."), "{err}");
    assert!(
        err.ends_with(" has no NRI (containerd has it from 1.7): nvhook's NRI plugin would give GPU pods nothing; upgrade containerd to 1.7 or later, or give GPUs through the runtime: nvhook configure containerd\n"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(read(&file), golden("containerd-1.7-default.toml"));
    let sid = nvhook_test_support::engines::ContainerdBuild::sid();
    let (code, out, err) = configure_nri_with(
        "containerd",
        &file,
        &["--dry-run"],
        &before_path(&dir_of(sid.program("containerd"))),
    );
    assert_eq!(code, 0, "{out}{err}");
    // No containerd at all: the config must show NRI.
    let nowhere = tempfile::tempdir().unwrap();
    let nowhere_path = nowhere.path().to_str().unwrap();
    let (code, _, err) = configure_nri_with(
        "containerd",
        &nowhere.path().join("config.toml"),
        &["--dry-run"],
        nowhere_path,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(
            "cannot tell whether this containerd has NRI (1.7 or later): no containerd on PATH"
        ),
        "{err}"
    );
    let (code, _, err) = configure_nri_with("containerd", &file, &["--dry-run"], nowhere_path);
    assert_eq!(code, 0, "a 1.7 config has the NRI table: {err}");
}

/// containerd 1.7 ships NRI off (`disable = true`): `--nri` turns it on in place, with no
/// runtime, says to restart containerd once and to start the plugin; `--remove` gives back
/// the original bytes.
#[test]
fn nri_turns_containerd_1_7_nri_on_and_remove_gives_back_the_file() {
    let (dir, file) = copy_of("containerd-1.7-default.toml", "config.toml");
    let (code, dry, _) = configure_nri("containerd", &file, &["--dry-run"]);
    assert_eq!(code, 0);
    assert!(
        dry.contains("-    disable = true\n+    disable = false # nvhook: was true\n"),
        "{dry}"
    );
    assert!(dry.contains("dry run: "), "{dry}");
    assert_eq!(read(&file), golden("containerd-1.7-default.toml"));

    let (code, said, _) = configure_nri("containerd", &file, &[]);
    assert_eq!(code, 0);
    assert_golden(&read(&file), "containerd-1.7-default.nri.toml");
    assert!(!read(&file).contains("runtimes.nvidia"));
    assert!(said.starts_with("enabled NRI in "), "{said}");
    assert!(
        said.contains("to apply it: systemctl restart containerd (once)"),
        "{said}"
    );
    assert!(
        said.contains("systemctl enable --now nvhook-nri.service"),
        "{said}"
    );

    let (_, again, _) = configure_nri("containerd", &file, &[]);
    assert!(again.starts_with("NRI already enabled: "), "{again}");
    assert!(!again.contains("restart"), "{again}");

    let (code, removed, _) = configure_nri("containerd", &file, &["--remove"]);
    assert_eq!(code, 0);
    assert!(
        removed.contains("systemctl disable --now nvhook-nri.service"),
        "{removed}"
    );
    assert_eq!(read(&file), golden("containerd-1.7-default.toml"));
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        2,
        "config and backup only"
    );
}

/// containerd 1.x's packaged config has no NRI section: one is added, and taken out again.
#[test]
fn nri_adds_the_section_a_containerd_1_config_lacks() {
    let (_dir, file) = copy_of("containerd-debian.toml", "config.toml");
    configure_nri("containerd", &file, &[]);
    assert_golden(&read(&file), "containerd-debian.nri.toml");
    configure_nri("containerd", &file, &["--remove"]);
    assert_eq!(read(&file), golden("containerd-debian.toml"));
}

/// containerd 2 runs NRI by default: `--nri` says so and writes nothing, drop-in included;
/// `--remove` leaves containerd 2's own `disable = false` alone. A config that turns NRI off
/// itself is turned on in place, and given back.
#[test]
fn nri_on_containerd_2_changes_nothing_unless_the_config_turns_it_off() {
    for (input, import) in DROP_IN_INPUTS {
        let node = Containerd2::new(input, import);
        for extra in [&[][..], &["--remove"]] {
            let (code, said, _) = configure_nri("containerd", &node.main, extra);
            assert_eq!(code, 0, "{input}");
            assert!(said.contains("unchanged"), "{input}: {said}");
            assert!(!said.contains("restart"), "{input}: {said}");
            assert_eq!(read(&node.main), node.original, "{input}");
            assert_eq!(fs::read_dir(node.dir.path()).unwrap().count(), 1, "{input}");
        }
    }
    let node = Containerd2::new("containerd-v3.toml", "abs");
    let (_, said, _) = configure_nri("containerd", &node.main, &[]);
    assert!(said.contains("containerd 2 runs it by default"), "{said}");

    let off = golden("containerd-2.3-default.toml").replace(
        "[plugins.'io.containerd.nri.v1.nri']\n    disable = false",
        "[plugins.'io.containerd.nri.v1.nri']\n    disable = true",
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    fs::write(&file, &off).unwrap();
    let (_, said, _) = configure_nri("containerd", &file, &[]);
    assert!(said.starts_with("enabled NRI in "), "{said}");
    assert_eq!(
        read(&file),
        off.replace(
            "    disable = true\n    socket_path",
            "    disable = false # nvhook: was true\n    socket_path"
        )
    );
    assert!(!dir.path().join("conf.d").exists());
    configure_nri("containerd", &file, &["--remove"]);
    assert_eq!(read(&file), off);
}

/// CRI-O: `[crio.nri] enable_nri = true` in nvhook's drop-in, gone again with --remove.
#[test]
fn nri_crio_drop_in_is_created_and_retired() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("99-nvidia.conf");
    let (code, said, _) = configure_nri("crio", &file, &[]);
    assert_eq!(code, 0);
    assert!(said.contains("systemctl restart crio"), "{said}");
    assert_golden(&read(&file), "crio-99-nvidia.nri.conf");
    configure_nri("crio", &file, &["--remove"]);
    assert!(!file.exists());
}

/// An engine without NRI, a runtime flag beside --nri: usage errors; a broken file: one line,
/// and nothing written.
#[test]
fn nri_bad_input_is_one_line_and_writes_nothing() {
    let (dir, file) = copy_of("containerd-1.7-default.toml", "config.toml");
    for (engine, extra, words) in [
        ("docker", &[][..], "NRI is for containerd and CRI-O"),
        ("k3s", &[][..], "NRI is for containerd and CRI-O"),
        (
            "containerd",
            &["--runtime-path", "/x"][..],
            "cannot be used with",
        ),
        (
            "containerd",
            &["--set-as-default"][..],
            "cannot be used with",
        ),
    ] {
        let (code, _, stderr) = configure_nri(engine, &file, extra);
        assert_eq!(code, 2, "{engine} {extra:?}: {stderr}");
        assert!(stderr.contains(words), "{stderr}");
    }
    let broken = "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\ndisable = \"yes\"\n";
    fs::write(&file, broken).unwrap();
    let (code, _, stderr) = configure_nri("containerd", &file, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("is not true or false"), "{stderr}");
    assert_eq!(read(&file), broken);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// containerd 2.1.9 itself reads NRI as on in what `--nri` wrote for a config that had it off.
#[test]
fn real_containerd_2_reads_nri_as_on() {
    let containerd = support::engines::ContainerdBuild::sid().program("containerd");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    for text in [
        golden("containerd-1.7-default.toml"),
        "version = 3\n[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n".to_owned(),
    ] {
        fs::write(&file, &text).unwrap();
        configure_nri("containerd", &file, &[]);
        let out = Command::new(&containerd)
            .arg("--config")
            .arg(&file)
            .args(["config", "dump"])
            .output()
            .unwrap();
        let dump = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let nri = dump
            .split("[plugins.'io.containerd.nri.v1.nri']")
            .nth(1)
            .unwrap_or_else(|| panic!("no NRI section:\n{dump}"));
        assert!(nri.trim_start().starts_with("disable = false"), "{nri}");
    }
}
