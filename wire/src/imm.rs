//! The INC immediate-data encoding carried in ImmDt of collective control messages:
//!
//! ```text
//! dest_rank[31:16] | primitive[15:14] | operator[13:12] | datatype[11:8]
//!                  | operator_hi[7:6] | reserved[5:0]
//! ```
//!
//! The seed layout with its reserved byte split: the operator code is 4 bits,
//! `operator_hi:operator` (codes 0-3 = the seed's Barrier, SUM, MAX, MIN have
//! `operator_hi` = 0), the datatype code uses the seed's free values 2-15. So every
//! immediate of the seed (reserved bits zero; this project puts the message kind 0-3
//! in them) means what it meant. Codes come from the tables in [`crate::dtype`].

use core::fmt;

pub use crate::dtype::{DataType, Operator};

/// Collective primitive (bits 15:14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Primitive {
    AllReduce = 0,
    Reduce = 1,
    Broadcast = 2,
    /// Every rank's block to every rank, the blocks interleaved on the stream (the
    /// project's extension: the seed leaves code 3 unused).
    AllGather = 3,
}

/// An invalid field in an INC immediate; names the field and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ImmError {
    #[error("invalid INC immediate 0x{imm:08x}: datatype {value} (expected 0-{})", DataType::ALL.len() - 1)]
    InvalidDataType { imm: u32, value: u8 },
    #[error("invalid INC immediate 0x{imm:08x}: operator {value} (expected 0-{})", Operator::ALL.len() - 1)]
    InvalidOperator { imm: u32, value: u8 },
    #[error("invalid INC immediate 0x{imm:08x}: operator {operator} does not apply to datatype {datatype}")]
    Unsupported { imm: u32, operator: Operator, datatype: DataType },
}

/// The decoded INC immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IncImm {
    /// Destination rank, or [`IncImm::ALL_RANKS`].
    pub dest_rank: u16,
    pub primitive: Primitive,
    pub operator: Operator,
    pub datatype: DataType,
    /// Bits 5:0 (inc-protocol: the message kind). [`IncImm::encode`] keeps only these
    /// six bits; bits 7:6 are the operator's high bits.
    pub reserved: u8,
}

impl IncImm {
    /// `dest_rank` value meaning every rank.
    pub const ALL_RANKS: u16 = 0xffff;

    /// Mask of [`IncImm::reserved`].
    pub const RESERVED_MASK: u8 = 0x3f;

    /// The 32-bit ImmDt value (host order; it travels big-endian like any BTH field).
    pub const fn encode(&self) -> u32 {
        let op = self.operator as u32;
        ((self.dest_rank as u32) << 16)
            | ((self.primitive as u32) << 14)
            | ((op & 0x3) << 12)
            | ((self.datatype as u32) << 8)
            | ((op >> 2) << 6)
            | (self.reserved & Self::RESERVED_MASK) as u32
    }

    /// Decodes an ImmDt value. Datatype and operator codes outside the tables, and
    /// operators that do not apply to the type (bitwise on a float) are errors.
    pub fn decode(imm: u32) -> Result<IncImm, ImmError> {
        let p = ((imm >> 14) & 0x3) as u8;
        let primitive = match p {
            0 => Primitive::AllReduce,
            1 => Primitive::Reduce,
            2 => Primitive::Broadcast,
            _ => Primitive::AllGather,
        };
        let value = (((imm >> 6) & 0x3) << 2 | ((imm >> 12) & 0x3)) as u8;
        let operator =
            Operator::from_code(value).ok_or(ImmError::InvalidOperator { imm, value })?;
        let value = ((imm >> 8) & 0xf) as u8;
        let datatype =
            DataType::from_code(value).ok_or(ImmError::InvalidDataType { imm, value })?;
        if !operator.applies_to(datatype) {
            return Err(ImmError::Unsupported { imm, operator, datatype });
        }
        Ok(IncImm {
            dest_rank: (imm >> 16) as u16,
            primitive,
            operator,
            datatype,
            reserved: imm as u8 & Self::RESERVED_MASK,
        })
    }
}

impl fmt::Display for IncImm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dest_rank == Self::ALL_RANKS {
            write!(f, "{:?}/{:?}/{:?} to all", self.primitive, self.operator, self.datatype)
        } else {
            write!(
                f,
                "{:?}/{:?}/{:?} to rank {}",
                self.primitive, self.operator, self.datatype, self.dest_rank
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout() {
        let i = IncImm {
            dest_rank: IncImm::ALL_RANKS,
            primitive: Primitive::Broadcast,
            operator: Operator::Max,
            datatype: DataType::Float32,
            reserved: 0x1a,
        };
        assert_eq!(i.encode(), 0xffff_a11a);
        assert_eq!(IncImm::decode(0xffff_a11a).unwrap(), i);
        assert_eq!(IncImm::decode(0x0000_c000).unwrap().primitive, Primitive::AllGather);
    }

    #[test]
    fn seed_values_keep_their_meaning() {
        // Every seed immediate: primitives 0-2, operators 0-3, datatypes 0-1, reserved
        // (message kind) 0-3.
        for p in 0..3u32 {
            for o in 0..4u32 {
                for d in 0..2u32 {
                    for kind in 0..4u32 {
                        let imm = 0x1234_0000 | p << 14 | o << 12 | d << 8 | kind;
                        let i = IncImm::decode(imm).unwrap();
                        assert_eq!(i.primitive as u32, p);
                        assert_eq!(i.operator as u32, o);
                        assert_eq!(i.datatype as u32, d);
                        assert_eq!(i.reserved as u32, kind);
                        assert_eq!(i.encode(), imm);
                    }
                }
            }
        }
    }

    #[test]
    fn extended_codes() {
        let i = IncImm {
            dest_rank: 3,
            primitive: Primitive::Reduce,
            operator: Operator::Bxor, // 8 = 0b10_00
            datatype: DataType::Uint64,
            reserved: 1,
        };
        assert_eq!(i.encode(), 0x0003_4681);
        assert_eq!(IncImm::decode(0x0003_4681), Ok(i));
        assert_eq!(
            IncImm::decode(0x0000_0a00),
            Err(ImmError::InvalidDataType { imm: 0xa00, value: 10 })
        );
        assert_eq!(
            IncImm::decode(0x0000_1080),
            Err(ImmError::InvalidOperator { imm: 0x1080, value: 9 })
        );
        let e = IncImm::decode(0x0000_3740).unwrap_err(); // Bor (7 = 0b01_11) on float16
        assert_eq!(
            e,
            ImmError::Unsupported {
                imm: 0x3740,
                operator: Operator::Bor,
                datatype: DataType::Float16
            }
        );
        assert!(e.to_string().contains("bor") && e.to_string().contains("float16"), "{e}");
    }

    /// Independent statement of which immediates are valid.
    fn valid(imm: u32) -> bool {
        let op = ((imm >> 6) & 3) << 2 | (imm >> 12) & 3;
        let dt = (imm >> 8) & 0xf;
        let bitwise = (6..=8).contains(&op);
        let float = matches!(dt, 1 | 7 | 8 | 9);
        op <= 8 && dt <= 9 && !(bitwise && float)
    }

    proptest! {
        #[test]
        fn decode_encode(imm in any::<u32>()) {
            match IncImm::decode(imm) {
                Ok(i) => {
                    prop_assert!(valid(imm));
                    prop_assert_eq!(i.encode(), imm);
                }
                Err(_) => prop_assert!(!valid(imm)),
            }
        }

        #[test]
        fn encode_decode(
            dest_rank in any::<u16>(),
            p in 0usize..4,
            o in 0..Operator::ALL.len(),
            d in 0..DataType::ALL.len(),
            reserved in 0u8..64,
        ) {
            let primitive = [
                Primitive::AllReduce,
                Primitive::Reduce,
                Primitive::Broadcast,
                Primitive::AllGather,
            ][p];
            let (operator, datatype) = (Operator::ALL[o], DataType::ALL[d]);
            let i = IncImm { dest_rank, primitive, operator, datatype, reserved };
            if operator.applies_to(datatype) {
                prop_assert_eq!(IncImm::decode(i.encode()), Ok(i));
            } else {
                let unsupported = matches!(IncImm::decode(i.encode()), Err(ImmError::Unsupported { .. }));
                prop_assert!(unsupported);
            }
        }
    }
}
