//! The INC immediate-data encoding carried in ImmDt of collective control messages:
//! `dest_rank[31:16] | primitive[15:14] | operator[13:12] | datatype[11:8] | reserved[7:0]`.

use core::fmt;

/// Collective primitive (bits 15:14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Primitive {
    AllReduce = 0,
    Reduce = 1,
    Broadcast = 2,
}

/// Reduction operator (bits 13:12). `Barrier` carries no data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    Barrier = 0,
    Sum = 1,
    Max = 2,
    Min = 3,
}

/// Element type (bits 11:8). Payload elements travel in network byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Int32 = 0,
    Float32 = 1,
}

impl DataType {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        4
    }
}

/// An invalid field in an INC immediate; names the field and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ImmError {
    #[error("invalid INC immediate 0x{imm:08x}: primitive {value} (expected 0-2)")]
    InvalidPrimitive { imm: u32, value: u8 },
    #[error("invalid INC immediate 0x{imm:08x}: datatype {value} (expected 0-1)")]
    InvalidDataType { imm: u32, value: u8 },
}

/// The decoded INC immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IncImm {
    /// Destination rank, or [`IncImm::ALL_RANKS`].
    pub dest_rank: u16,
    pub primitive: Primitive,
    pub operator: Operator,
    pub datatype: DataType,
    pub reserved: u8,
}

impl IncImm {
    /// `dest_rank` value meaning every rank.
    pub const ALL_RANKS: u16 = 0xffff;

    /// The 32-bit ImmDt value (host order; it travels big-endian like any BTH field).
    pub const fn encode(&self) -> u32 {
        ((self.dest_rank as u32) << 16)
            | ((self.primitive as u32) << 14)
            | ((self.operator as u32) << 12)
            | ((self.datatype as u32) << 8)
            | self.reserved as u32
    }

    /// Decodes an ImmDt value; primitive 3 and datatypes 2-15 are errors.
    pub fn decode(imm: u32) -> Result<IncImm, ImmError> {
        let p = ((imm >> 14) & 0x3) as u8;
        let primitive = match p {
            0 => Primitive::AllReduce,
            1 => Primitive::Reduce,
            2 => Primitive::Broadcast,
            value => return Err(ImmError::InvalidPrimitive { imm, value }),
        };
        let operator = match (imm >> 12) & 0x3 {
            0 => Operator::Barrier,
            1 => Operator::Sum,
            2 => Operator::Max,
            _ => Operator::Min,
        };
        let datatype = match ((imm >> 8) & 0xf) as u8 {
            0 => DataType::Int32,
            1 => DataType::Float32,
            value => return Err(ImmError::InvalidDataType { imm, value }),
        };
        Ok(IncImm {
            dest_rank: (imm >> 16) as u16,
            primitive,
            operator,
            datatype,
            reserved: imm as u8,
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
            reserved: 0x5a,
        };
        assert_eq!(i.encode(), 0xffff_a15a);
        assert_eq!(IncImm::decode(0xffff_a15a).unwrap(), i);
        assert_eq!(
            IncImm::decode(0x0000_c000),
            Err(ImmError::InvalidPrimitive { imm: 0xc000, value: 3 })
        );
        assert_eq!(
            IncImm::decode(0x0000_0200),
            Err(ImmError::InvalidDataType { imm: 0x200, value: 2 })
        );
    }

    proptest! {
        #[test]
        fn decode_encode(imm in any::<u32>()) {
            match IncImm::decode(imm) {
                Ok(i) => prop_assert_eq!(i.encode(), imm),
                Err(_) => prop_assert!((imm >> 14) & 3 == 3 || (imm >> 8) & 0xf > 1),
            }
        }
    }
}
