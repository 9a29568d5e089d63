//! Extending an attached device program: allow blocks for the GPU rules, then the
//! original instructions unchanged.
//!
//! The prefix only ever returns 1 (allow) or falls through, so the combined program
//! allows exactly the union of the rules and what the original allowed. Jumps in the
//! original are relative, so they stay valid after it moves down; the prefix leaves R1
//! (the context pointer) untouched because the original reads it on entry, and it only
//! writes registers that the verifier proved the original never reads before writing.

use super::insn::{Insn, R0, R1, R2, R3, R4, R5, op};
use crate::DeviceRule;

/// Why an attached program cannot be extended: it uses instructions whose xlated
/// (kernel-rewritten) form cannot be loaded again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("instruction {0} calls a function")]
    Call(usize),
    #[error("instruction {0} loads a map or kernel address")]
    PseudoLoad(usize),
    #[error("it is empty")]
    Empty,
}

const ACCESS_MASK: u32 = 0xffff;

/// Loads what the blocks compare: R2 = type, R3 = access, R4 = major, R5 = minor.
fn load_context() -> [Insn; 6] {
    [
        Insn::load_word(R2, R1, 0),
        Insn::alu32_reg(op::MOV, R3, R2),
        Insn::alu32_imm(op::RSH, R3, 16),
        Insn::alu32_imm(op::AND, R2, ACCESS_MASK as i32),
        Insn::load_word(R4, R1, 4),
        Insn::load_word(R5, R1, 8),
    ]
}

/// One rule: return 1 if type, major and minor match and every requested access bit is
/// one the rule grants; otherwise jump past the block.
fn allow_block(rule: &DeviceRule) -> Vec<Insn> {
    // Device numbers compare as the kernel's u32; the immediate is sign-extended to 64
    // bits, so numbers of 2^31 and above need a 32-bit compare to match.
    let cmp = |reg, value: u32| {
        let code = if value > i32::MAX as u32 {
            op::JMP32
        } else {
            op::JMP
        };
        Insn::new(code | op::JNE | op::K, reg, 0, 0, value as i32)
    };
    let mut block = vec![
        cmp(R2, crate::bpf::kind_value(rule.kind)),
        cmp(R4, rule.major),
        cmp(R5, rule.minor),
    ];
    let denied = !crate::bpf::access_bits(rule.access) & ACCESS_MASK;
    if crate::bpf::access_bits(rule.access) != 7 {
        block.push(Insn::jump_imm(op::JSET, R3, denied as i32, 0));
    }
    block.push(Insn::alu32_imm(op::MOV, R0, 1));
    block.push(Insn::exit());
    let len = block.len();
    for (at, insn) in block.iter_mut().enumerate().take(len - 2) {
        insn.off = (len - at - 1) as i16;
    }
    block
}

/// The instructions that allow `rules` before handing over to the rest of the program.
pub(crate) fn allow_prefix(rules: &[DeviceRule]) -> Vec<Insn> {
    let mut prefix = load_context().to_vec();
    prefix.extend(rules.iter().flat_map(allow_block));
    prefix
}

/// `original` with `rules` allowed in front of it.
pub(crate) fn extend(rules: &[DeviceRule], original: &[Insn]) -> Result<Vec<Insn>, Unsupported> {
    if original.is_empty() {
        return Err(Unsupported::Empty);
    }
    for (at, insn) in original.iter().enumerate() {
        // Helper calls come back with kernel-internal offsets in place of helper ids.
        if insn.class() == op::JMP && insn.code & 0xf0 == op::CALL {
            return Err(Unsupported::Call(at));
        }
        // Map references come back as ids or addresses, not as fds a load accepts.
        if insn.code == op::LD | op::IMM | op::DW && insn.src != 0 {
            return Err(Unsupported::PseudoLoad(at));
        }
    }
    let mut program = allow_prefix(rules);
    program.extend_from_slice(original);
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::super::interp::{Ctx, run, runc_program};
    use super::*;
    use crate::{Access, DeviceKind};

    const C: DeviceKind = DeviceKind::Char;
    const B: DeviceKind = DeviceKind::Block;

    fn rule(kind: DeviceKind, major: u32, minor: u32, access: &str) -> DeviceRule {
        DeviceRule {
            kind,
            major,
            minor,
            access: access.parse().unwrap(),
        }
    }

    fn gpu_rules() -> Vec<DeviceRule> {
        vec![
            rule(C, 195, 0, "rw"),
            rule(C, 195, 255, "rw"),
            rule(C, 510, 1, "r"),
            rule(B, 259, 3, "rwm"),
        ]
    }

    /// runc's default allow-list, cut down: /dev/null rwm, /dev/zero rwm, mknod of any
    /// char device, everything else denied.
    fn deny_all_but_null() -> Vec<Insn> {
        runc_program(
            &[
                (C, None, None, "m"),
                (C, Some(1), Some(3), "rwm"),
                (C, Some(1), Some(5), "rwm"),
            ],
            false,
        )
    }

    fn verdict(prog: &[Insn], kind: DeviceKind, major: u32, minor: u32, access: &str) -> u64 {
        let access: Access = access.parse().unwrap();
        let ctx = Ctx::new(
            crate::bpf::kind_value(kind) | crate::bpf::access_bits(access) << 16,
            major,
            minor,
        );
        run(prog, &ctx).unwrap()
    }

    #[test]
    fn gpu_devices_are_allowed_and_the_rest_keeps_the_original_verdict() {
        let original = deny_all_but_null();
        let combined = extend(&gpu_rules(), &original).unwrap();
        assert_eq!(&combined[combined.len() - original.len()..], &original[..]);
        let table: &[(DeviceKind, u32, u32, &str, u64)] = &[
            // granted by the prefix
            (C, 195, 0, "rw", 1),
            (C, 195, 0, "r", 1),
            (C, 195, 0, "w", 1),
            (C, 195, 255, "rw", 1),
            (C, 510, 1, "r", 1),
            (B, 259, 3, "rwm", 1),
            (B, 259, 3, "w", 1),
            // more access than granted: the original decides (mknod of chars it allows)
            (C, 195, 0, "rwm", 0),
            (C, 195, 0, "m", 1),
            (C, 510, 1, "rw", 0),
            (C, 510, 1, "w", 0),
            // neighbours of the GPU devices stay denied
            (C, 195, 1, "rw", 0),
            (C, 195, 254, "r", 0),
            (C, 194, 0, "rw", 0),
            (B, 195, 0, "rw", 0),
            (C, 259, 3, "rw", 0),
            (B, 259, 4, "r", 0),
            // the original's own allow-list is unchanged
            (C, 1, 3, "rwm", 1),
            (C, 1, 5, "r", 1),
            (C, 1, 7, "r", 0),
            (B, 8, 0, "m", 0),
        ];
        for &(kind, major, minor, access, want) in table {
            assert_eq!(
                verdict(&combined, kind, major, minor, access),
                want,
                "{kind} {major}:{minor} {access}"
            );
        }
    }

    #[test]
    fn allow_all_original_still_allows_everything() {
        let original = runc_program(&[], true);
        let combined = extend(&gpu_rules(), &original).unwrap();
        for (kind, major, minor, access) in [(C, 195, 0, "rw"), (C, 195, 7, "rwm"), (B, 8, 0, "w")]
        {
            assert_eq!(verdict(&combined, kind, major, minor, access), 1);
        }
    }

    #[test]
    fn deny_rules_in_the_original_still_apply_to_other_devices() {
        // runc's "privileged except /dev/sda" shape: a deny block, then allow by default.
        let original = runc_program(&[(B, Some(8), Some(0), "rwm")], true);
        let combined = extend(&gpu_rules(), &original).unwrap();
        assert_eq!(verdict(&combined, B, 8, 0, "r"), 0);
        assert_eq!(verdict(&combined, B, 8, 1, "r"), 1);
        assert_eq!(verdict(&combined, C, 195, 0, "rw"), 1);
    }

    #[test]
    fn no_rules_leaves_the_verdicts_alone() {
        let original = deny_all_but_null();
        let combined = extend(&[], &original).unwrap();
        for (kind, major, minor, access) in [(C, 1, 3, "rw"), (C, 195, 0, "rw"), (B, 1, 3, "r")] {
            assert_eq!(
                verdict(&combined, kind, major, minor, access),
                verdict(&original, kind, major, minor, access)
            );
        }
    }

    #[test]
    fn device_numbers_beyond_i32_compare_as_u32() {
        let big = u32::MAX - 1;
        let combined = extend(&[rule(C, big, big, "rw")], &deny_all_but_null()).unwrap();
        assert_eq!(verdict(&combined, C, big, big, "rw"), 1);
        assert_eq!(verdict(&combined, C, big, big - 1, "rw"), 0);
    }

    #[test]
    fn extending_twice_is_harmless() {
        let once = extend(&gpu_rules(), &deny_all_but_null()).unwrap();
        let twice = extend(&gpu_rules(), &once).unwrap();
        assert_eq!(verdict(&twice, C, 195, 0, "rw"), 1);
        assert_eq!(verdict(&twice, C, 195, 1, "rw"), 0);
        assert_eq!(verdict(&twice, C, 1, 3, "rw"), 1);
    }

    #[test]
    fn programs_that_cannot_be_reloaded_are_refused() {
        let mut original = deny_all_but_null();
        assert_eq!(extend(&[], &[]), Err(Unsupported::Empty));
        original.insert(1, Insn::new(op::JMP | op::CALL, 0, 0, 0, 14));
        assert_eq!(extend(&gpu_rules(), &original), Err(Unsupported::Call(1)));
        original[1] = Insn::new(op::LD | op::IMM | op::DW, R2, 1, 0, 7);
        assert_eq!(
            extend(&gpu_rules(), &original),
            Err(Unsupported::PseudoLoad(1))
        );
    }
}
