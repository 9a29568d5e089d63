//! A small interpreter for cgroup device programs, so that the filter logic is tested
//! without loading anything into a kernel; plus a generator of programs in the exact shape
//! runc emits, to stand in for "the program the runtime attached".

use super::insn::{Insn, R0, R1, R2, R3, R4, R5, op};
use crate::{Access, DeviceKind};

/// `struct bpf_cgroup_dev_ctx`: `access_type` is `type | access << 16`.
pub struct Ctx([u8; 12]);

impl Ctx {
    pub fn new(access_type: u32, major: u32, minor: u32) -> Ctx {
        let mut bytes = [0u8; 12];
        for (at, value) in [access_type, major, minor].into_iter().enumerate() {
            bytes[at * 4..at * 4 + 4].copy_from_slice(&value.to_le_bytes());
        }
        Ctx(bytes)
    }
}

/// Where R1 points on entry; any other address is outside the context and faults.
const CTX_ADDR: u64 = 0x1000_0000;
/// More steps than any loop-free program of this size can take.
const STEP_LIMIT: usize = 1 << 16;

/// Runs `prog` and returns R0 at `exit`; an error names the instruction it choked on.
pub fn run(prog: &[Insn], ctx: &Ctx) -> Result<u64, String> {
    let mut regs = [0u64; 11];
    regs[R1 as usize] = CTX_ADDR;
    let mut pc = 0usize;
    for _ in 0..STEP_LIMIT {
        let insn = *prog.get(pc).ok_or(format!("ran off the end at {pc}"))?;
        let at = pc;
        let fail = || format!("unsupported instruction {at}: {insn:?}");
        let (dst, src) = (insn.dst as usize, insn.src as usize);
        if dst > 10 || src > 10 {
            return Err(fail());
        }
        pc += 1;
        match insn.class() {
            op::LDX => {
                let size = match insn.code {
                    c if c == op::LDX | op::MEM | op::W => 4,
                    c if c == op::LDX | op::MEM | op::H => 2,
                    c if c == op::LDX | op::MEM | op::B => 1,
                    _ => return Err(fail()),
                };
                let at = regs[src]
                    .wrapping_add(insn.off as i64 as u64)
                    .checked_sub(CTX_ADDR)
                    .map(|a| a as usize)
                    .filter(|a| a + size <= 12 && a % size == 0)
                    .ok_or_else(|| format!("instruction {at}: load outside the context"))?;
                let mut value = [0u8; 8];
                value[..size].copy_from_slice(&ctx.0[at..at + size]);
                regs[dst] = u64::from_le_bytes(value);
            }
            class @ (op::ALU | op::ALU64) => {
                let operand = if insn.code & op::X != 0 {
                    regs[src]
                } else {
                    insn.imm as i64 as u64
                };
                let a = regs[dst];
                let result = match insn.code & 0xf0 {
                    op::ADD => a.wrapping_add(operand),
                    op::SUB => a.wrapping_sub(operand),
                    op::OR => a | operand,
                    op::AND => a & operand,
                    op::XOR => a ^ operand,
                    op::MOV => operand,
                    op::LSH if class == op::ALU => {
                        u64::from((a as u32).wrapping_shl(operand as u32))
                    }
                    op::RSH if class == op::ALU => {
                        u64::from((a as u32).wrapping_shr(operand as u32))
                    }
                    op::LSH => a.wrapping_shl(operand as u32),
                    op::RSH => a.wrapping_shr(operand as u32),
                    _ => return Err(fail()),
                };
                regs[dst] = if class == op::ALU {
                    result & 0xffff_ffff
                } else {
                    result
                };
            }
            class @ (op::JMP | op::JMP32) => {
                let jmp = insn.code & 0xf0;
                if insn.code == op::JMP | op::EXIT {
                    return Ok(regs[R0 as usize]);
                }
                let operand = if insn.code & op::X != 0 {
                    regs[src]
                } else {
                    insn.imm as i64 as u64
                };
                let (a, b) = match class {
                    op::JMP32 => (regs[dst] & 0xffff_ffff, operand & 0xffff_ffff),
                    _ => (regs[dst], operand),
                };
                let taken = match jmp {
                    op::JA if class == op::JMP => true,
                    op::JEQ => a == b,
                    op::JNE => a != b,
                    op::JGT => a > b,
                    op::JGE => a >= b,
                    op::JLT => a < b,
                    op::JLE => a <= b,
                    op::JSET => a & b != 0,
                    _ => return Err(fail()),
                };
                if taken {
                    pc = pc
                        .checked_add_signed(insn.off as isize)
                        .ok_or_else(|| format!("instruction {at}: jump before the start"))?;
                }
            }
            _ => return Err(fail()),
        }
    }
    Err("step limit reached (loop?)".to_owned())
}

/// A program as runc's devicefilter generates it: load type/access/major/minor into
/// R2..R5, one block per rule that returns `!default_allow` on a match (a `None` major or
/// minor is a wildcard), and a final `return default_allow`.
pub fn runc_program(
    rules: &[(DeviceKind, Option<u32>, Option<u32>, &str)],
    default_allow: bool,
) -> Vec<Insn> {
    let mut prog = vec![
        Insn::load_word(R2, R1, 0),
        Insn::alu32_imm(op::AND, R2, 0xffff),
        Insn::load_word(R3, R1, 0),
        Insn::alu32_imm(op::RSH, R3, 16),
        Insn::load_word(R4, R1, 4),
        Insn::load_word(R5, R1, 8),
    ];
    for &(kind, major, minor, access) in rules {
        let bits = crate::bpf::access_bits(access.parse::<Access>().unwrap());
        let mut block = vec![Insn::jump_imm(
            op::JNE,
            R2,
            crate::bpf::kind_value(kind) as i32,
            0,
        )];
        if bits != 7 {
            // runc's subset test, clobbering R1 as a temporary
            block.push(Insn::alu32_reg(op::MOV, R1, R3));
            block.push(Insn::alu32_imm(op::AND, R1, bits as i32));
            block.push(Insn::jump_reg(op::JNE, R1, R3, 0));
        }
        block.extend(major.map(|m| Insn::jump_imm(op::JNE, R4, m as i32, 0)));
        block.extend(minor.map(|m| Insn::jump_imm(op::JNE, R5, m as i32, 0)));
        block.push(Insn::alu32_imm(op::MOV, R0, i32::from(!default_allow)));
        block.push(Insn::exit());
        let len = block.len();
        for (at, insn) in block.iter_mut().enumerate() {
            if insn.class() == op::JMP && insn.code & 0xf0 == op::JNE {
                insn.off = (len - at - 1) as i16;
            }
        }
        prog.extend(block);
    }
    prog.push(Insn::alu32_imm(op::MOV, R0, i32::from(default_allow)));
    prog.push(Insn::exit());
    prog
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: DeviceKind = DeviceKind::Char;

    fn char_open(major: u32, minor: u32, access: &str) -> Ctx {
        let bits = crate::bpf::access_bits(access.parse::<Access>().unwrap());
        Ctx::new(crate::bpf::kind_value(C) | bits << 16, major, minor)
    }

    #[test]
    fn runc_shaped_program_matches_its_rules() {
        // the shape of runc's TestDeviceFilter_BuiltInAllowList, cut down
        let prog = runc_program(
            &[
                (C, None, None, "m"),
                (C, Some(1), Some(3), "rwm"),
                (C, Some(136), None, "rwm"),
            ],
            false,
        );
        assert_eq!(prog.len(), 6 + 6 + 5 + 4 + 2);
        assert_eq!(run(&prog, &char_open(1, 3, "rw")), Ok(1));
        assert_eq!(run(&prog, &char_open(136, 9, "r")), Ok(1));
        assert_eq!(run(&prog, &char_open(5, 0, "m")), Ok(1));
        assert_eq!(run(&prog, &char_open(5, 0, "rm")), Ok(0));
        assert_eq!(run(&prog, &char_open(1, 4, "r")), Ok(0));
    }

    #[test]
    fn faults_are_reported_not_guessed() {
        let load_past_ctx = [Insn::load_word(R2, R1, 12), Insn::exit()];
        assert!(
            run(&load_past_ctx, &char_open(1, 3, "r"))
                .unwrap_err()
                .contains("outside the context")
        );
        let no_exit = [Insn::alu32_imm(op::MOV, R0, 1)];
        assert!(
            run(&no_exit, &char_open(1, 3, "r"))
                .unwrap_err()
                .contains("off the end")
        );
        let backwards = [Insn::jump_imm(op::JA, 0, 0, -1)];
        assert!(
            run(&backwards, &char_open(1, 3, "r"))
                .unwrap_err()
                .contains("step limit")
        );
        let call = [Insn::new(op::JMP | op::CALL, 0, 0, 0, 1), Insn::exit()];
        assert!(
            run(&call, &char_open(1, 3, "r"))
                .unwrap_err()
                .contains("unsupported")
        );
    }

    #[test]
    fn jmp32_compares_the_low_half_only() {
        let prog = [
            Insn::load_word(R2, R1, 4),
            Insn::alu32_imm(op::MOV, R0, 0),
            Insn::new(op::JMP32 | op::JNE | op::K, R2, 0, 1, -2),
            Insn::alu32_imm(op::MOV, R0, 1),
            Insn::exit(),
        ];
        assert_eq!(run(&prog, &Ctx::new(2, u32::MAX - 1, 0)), Ok(1));
        assert_eq!(run(&prog, &Ctx::new(2, 7, 0)), Ok(0));
    }
}
