use super::*;
use crate::delivery::cdi_spec::{ContainerEdits, Hook};
use std::os::unix::fs::PermissionsExt;

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

const PREFIX: [&str; 5] = [
    "nvhook",
    "--config",
    "/etc/nvhook/config.toml",
    "hook",
    "createRuntime",
];

/// Edits whose createRuntime hook is nvhook's with `args` after `hook createRuntime`.
pub(super) fn edits_with(args: &[&str]) -> ContainerEdits {
    ContainerEdits {
        hooks: vec![Hook {
            hook_name: "createRuntime".into(),
            path: "/usr/bin/nvhook".into(),
            args: strings(&PREFIX).into_iter().chain(strings(args)).collect(),
            env: Vec::new(),
            timeout: None,
        }],
        ..ContainerEdits::default()
    }
}

fn spec_with(args: &[&str]) -> CdiSpec {
    CdiSpec {
        cdi_version: "0.6.0".into(),
        kind: "nvidia.com/gpu".into(),
        devices: Vec::new(),
        container_edits: edits_with(args),
    }
}

const LINK_ARGS: [&str; 8] = [
    "--bind-files",
    "/usr/lib/x86_64-linux-gnu",
    "libcuda.so.580.95.05,libnvidia-ml.so.580.95.05",
    "--gpu-layout",
    "1f0c3a5e7b9d2c4f",
    "--links",
    "/usr/lib/x86_64-linux-gnu",
    "libcuda.so.1=libcuda.so.580.95.05",
];

/// A spec in a private directory with its arguments moved out, the file written.
fn externalized(dir: &Path) -> (CdiSpec, ArgsFile) {
    let mut spec = spec_with(&LINK_ARGS);
    let file = externalize(&mut spec, &dir.join("nvidia.yaml")).expect("moved");
    file.write().unwrap();
    (spec, file)
}

fn hook_args(spec: &CdiSpec) -> &[String] {
    &spec.container_edits.hooks[0].args[PREFIX.len()..]
}

#[test]
fn the_hook_gets_back_the_arguments_the_spec_was_written_with() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, file) = externalized(dir.path());
    let args = hook_args(&spec);
    assert_eq!(args[0], FLAG);
    assert_eq!(args[1], file.path.display().to_string());
    // The GPU layout stamp stays in the spec.
    assert_eq!(args[3..], strings(&["--gpu-layout", "1f0c3a5e7b9d2c4f"]));
    let name = file.path.file_name().unwrap().to_str().unwrap();
    assert_eq!(name, format!(".nvidia.yaml.{}.args", args[2]));
    let inlined = inline(args).unwrap();
    let mut expected = strings(&LINK_ARGS);
    let stamp: Vec<String> = expected.drain(3..5).collect();
    expected.extend(stamp);
    assert_eq!(*inlined, expected);
    // Arguments without the flag are the hook's as they are.
    assert!(matches!(inline(&expected).unwrap(), Cow::Borrowed(_)));
}

#[test]
fn other_arguments_make_another_file() {
    let dir = tempfile::tempdir().unwrap();
    let (_, file) = externalized(dir.path());
    let mut other = spec_with(&LINK_ARGS[..3]);
    let second = externalize(&mut other, &dir.path().join("nvidia.yaml")).unwrap();
    assert_ne!(file.path, second.path);
    // The same arguments under another stamp keep the file.
    let mut restamped = spec_with(&LINK_ARGS);
    restamped.container_edits.hooks[0].args[PREFIX.len() + 4] = "00000000000000ff".into();
    assert_eq!(
        externalize(&mut restamped, &dir.path().join("nvidia.yaml")).unwrap(),
        file
    );
}

#[test]
fn a_file_that_no_longer_holds_what_the_spec_wrote_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, file) = externalized(dir.path());
    std::fs::write(&file.path, "--bind-files\n/usr/lib\nlibevil.so\n").unwrap();
    let e = inline(hook_args(&spec)).unwrap_err().to_string();
    assert!(
        e.contains("does not hold the arguments its spec was written with")
            && e.contains("nvhook cdi refresh")
            && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn a_missing_file_names_itself_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, file) = externalized(dir.path());
    std::fs::remove_file(&file.path).unwrap();
    let e = inline(hook_args(&spec)).unwrap_err();
    assert!(
        matches!(&e, ArgsFileError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    let e = e.to_string();
    assert!(
        e.contains(&file.path.display().to_string()) && e.contains("nvhook cdi refresh"),
        "{e}"
    );
}

#[test]
fn a_file_others_may_write_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, file) = externalized(dir.path());
    std::fs::set_permissions(&file.path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = inline(hook_args(&spec)).unwrap_err();
    assert!(matches!(e, ArgsFileError::Untrusted { .. }), "{e}");
    std::fs::set_permissions(&file.path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = inline(hook_args(&spec)).unwrap_err();
    assert!(
        e.to_string().contains("others may write its directory"),
        "{e}"
    );
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(inline(hook_args(&spec)).is_ok());
    // Through a symlink: not followed.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::rename(&file.path, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &file.path).unwrap();
    assert!(matches!(
        inline(hook_args(&spec)).unwrap_err(),
        ArgsFileError::Read { .. }
    ));
}

#[test]
fn the_flag_takes_an_absolute_path_and_a_sum() {
    for args in [
        &["--args-file"][..],
        &["--args-file", "/run/cdi/.nvidia.yaml.x.args"],
        &["--args-file", "nvidia.args", "1f0c3a5e7b9d2c4f"],
        &[
            "--args-file",
            "/run/cdi/.nvidia.yaml.x.args",
            "1f0c3a5e7b9d2c4",
        ],
    ] {
        assert!(
            matches!(inline(&strings(args)), Err(ArgsFileError::Usage)),
            "{args:?}"
        );
    }
}

#[test]
fn an_argument_with_a_line_break_keeps_them_all_in_the_spec() {
    let mut spec = spec_with(&["--bind-file", "/usr/lib/a\nb", "/usr/lib/a\nb"]);
    let before = spec.clone();
    assert_eq!(
        externalize(&mut spec, Path::new("/etc/cdi/nvidia.yaml")),
        None
    );
    assert_eq!(spec, before);
    // A spec without nvhook's hook arguments has nothing to move.
    let mut bare = spec_with(&[]);
    assert_eq!(
        externalize(&mut bare, Path::new("/etc/cdi/nvidia.yaml")),
        None
    );
}

#[test]
fn the_file_a_spec_names_is_found_in_its_text() {
    let dir = tempfile::tempdir().unwrap();
    let spec_path = dir.path().join("nvidia.yaml");
    let (spec, file) = externalized(dir.path());
    for format in [
        crate::delivery::cdi_spec::Format::Yaml,
        crate::delivery::cdi_spec::Format::Json,
    ] {
        assert_eq!(
            named_in(&spec.to_text(format), &spec_path),
            Some(file.path.clone())
        );
    }
    assert_eq!(named_in("kind: nvidia.com/gpu\n", &spec_path), None);
}

#[test]
fn only_the_spec_s_other_files_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let spec_path = dir.path().join("nvidia.yaml");
    let file = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, "x\n").unwrap();
        path
    };
    let current = file(".nvidia.yaml.0000000000000001.args");
    let previous = file(".nvidia.yaml.0000000000000002.args");
    let older = file(".nvidia.yaml.0000000000000003.args");
    let other_spec = file(".imex.yaml.0000000000000004.args");
    let unrelated = file(".nvidia.yaml.notes.args");
    let removed = remove_others(&spec_path, &[&current, &previous]).unwrap();
    assert_eq!(removed, vec![older.clone()]);
    for kept in [current, previous, other_spec, unrelated] {
        assert!(kept.exists(), "{}", kept.display());
    }
    assert!(!older.exists());
}
