//! eBPF instruction encoding (`struct bpf_insn`), limited to what device programs use.

/// Opcode parts: `code = class | op | source` (ALU, JMP) or `class | size | mode` (loads).
pub mod op {
    pub const LD: u8 = 0x00;
    pub const LDX: u8 = 0x01;
    pub const ALU: u8 = 0x04;
    pub const JMP: u8 = 0x05;
    pub const JMP32: u8 = 0x06;
    pub const ALU64: u8 = 0x07;

    pub const W: u8 = 0x00;
    pub const H: u8 = 0x08;
    pub const B: u8 = 0x10;
    pub const DW: u8 = 0x18;
    pub const IMM: u8 = 0x00;
    pub const MEM: u8 = 0x60;

    /// Source operand: the immediate (K) or a register (X).
    pub const K: u8 = 0x00;
    pub const X: u8 = 0x08;

    pub const ADD: u8 = 0x00;
    pub const SUB: u8 = 0x10;
    pub const OR: u8 = 0x40;
    pub const AND: u8 = 0x50;
    pub const LSH: u8 = 0x60;
    pub const RSH: u8 = 0x70;
    pub const XOR: u8 = 0xa0;
    pub const MOV: u8 = 0xb0;

    pub const JA: u8 = 0x00;
    pub const JEQ: u8 = 0x10;
    pub const JGT: u8 = 0x20;
    pub const JGE: u8 = 0x30;
    pub const JSET: u8 = 0x40;
    pub const JNE: u8 = 0x50;
    pub const CALL: u8 = 0x80;
    pub const EXIT: u8 = 0x90;
    pub const JLT: u8 = 0xa0;
    pub const JLE: u8 = 0xb0;
}

/// Registers: R0 holds the verdict, R1 the context pointer on entry, R10 the frame pointer.
pub type Reg = u8;
pub const R0: Reg = 0;
pub const R1: Reg = 1;
pub const R2: Reg = 2;
pub const R3: Reg = 3;
pub const R4: Reg = 4;
pub const R5: Reg = 5;

/// One `struct bpf_insn`. Jump offsets count instructions, relative to the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub dst: Reg,
    pub src: Reg,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    pub const SIZE: usize = 8;

    pub const fn new(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            dst,
            src,
            off,
            imm,
        }
    }

    /// `dst = *(u32 *)(src + off)`
    pub const fn load_word(dst: Reg, src: Reg, off: i16) -> Insn {
        Insn::new(op::LDX | op::MEM | op::W, dst, src, off, 0)
    }

    /// `dst = (u32)(dst <op> imm)`
    pub const fn alu32_imm(alu: u8, dst: Reg, imm: i32) -> Insn {
        Insn::new(op::ALU | alu | op::K, dst, 0, 0, imm)
    }

    /// `dst = (u32)(dst <op> src)`
    pub const fn alu32_reg(alu: u8, dst: Reg, src: Reg) -> Insn {
        Insn::new(op::ALU | alu | op::X, dst, src, 0, 0)
    }

    /// `if (dst <jmp> imm) goto +off`, comparing all 64 bits.
    pub const fn jump_imm(jmp: u8, dst: Reg, imm: i32, off: i16) -> Insn {
        Insn::new(op::JMP | jmp | op::K, dst, 0, off, imm)
    }

    /// `if (dst <jmp> src) goto +off`, comparing all 64 bits.
    pub const fn jump_reg(jmp: u8, dst: Reg, src: Reg, off: i16) -> Insn {
        Insn::new(op::JMP | jmp | op::X, dst, src, off, 0)
    }

    pub const fn exit() -> Insn {
        Insn::new(op::JMP | op::EXIT, 0, 0, 0, 0)
    }

    pub fn class(self) -> u8 {
        self.code & 0x07
    }

    /// Little-endian layout with `dst_reg:4, src_reg:4` packed low nibble first, which is
    /// what the bitfield means on every little-endian target.
    pub fn encode(self) -> [u8; Insn::SIZE] {
        let mut out = [0u8; Insn::SIZE];
        out[0] = self.code;
        out[1] = (self.dst & 0x0f) | (self.src << 4);
        out[2..4].copy_from_slice(&self.off.to_le_bytes());
        out[4..8].copy_from_slice(&self.imm.to_le_bytes());
        out
    }

    pub fn decode(bytes: [u8; Insn::SIZE]) -> Insn {
        Insn {
            code: bytes[0],
            dst: bytes[1] & 0x0f,
            src: bytes[1] >> 4,
            off: i16::from_le_bytes([bytes[2], bytes[3]]),
            imm: i32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        }
    }
}

/// Encodes a program for `BPF_PROG_LOAD`.
pub fn encode_program(insns: &[Insn]) -> Vec<u8> {
    insns.iter().flat_map(|i| i.encode()).collect()
}

/// Decodes the kernel's `xlated_prog_insns`; a trailing partial instruction is dropped
/// (the kernel always reports whole instructions).
pub fn decode_program(bytes: &[u8]) -> Vec<Insn> {
    bytes
        .chunks_exact(Insn::SIZE)
        .map(|c| Insn::decode(c.try_into().expect("chunks_exact yields SIZE bytes")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_the_kernel_macros() {
        // BPF_LDX_MEM(BPF_W, BPF_REG_2, BPF_REG_1, 4)
        assert_eq!(
            Insn::load_word(R2, R1, 4).encode(),
            [0x61, 0x12, 4, 0, 0, 0, 0, 0]
        );
        // BPF_JMP_IMM(BPF_JNE, BPF_REG_4, 195, 3)
        assert_eq!(
            Insn::jump_imm(op::JNE, R4, 195, 3).encode(),
            [0x55, 0x04, 3, 0, 195, 0, 0, 0]
        );
        // BPF_ALU32_IMM(BPF_AND, BPF_REG_2, 0xffff)
        assert_eq!(
            Insn::alu32_imm(op::AND, R2, 0xffff).encode(),
            [0x54, 0x02, 0, 0, 0xff, 0xff, 0, 0]
        );
        assert_eq!(Insn::exit().encode(), [0x95, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn decode_inverts_encode() {
        let prog = [
            Insn::jump_reg(op::JNE, R1, R3, -7),
            Insn::alu32_imm(op::MOV, R0, -1),
            Insn::alu32_reg(op::MOV, R1, R3),
        ];
        let bytes = encode_program(&prog);
        assert_eq!(bytes.len(), 24);
        assert_eq!(decode_program(&bytes), prog);
    }
}
