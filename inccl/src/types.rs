//! Element types and reduction operators of the public API.

use std::fmt;
use std::str::FromStr;

/// Element type of a collective's vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// 32-bit two's complement integer; sums wrap.
    Int32,
    /// IEEE 754 binary32.
    Float32,
}

impl DataType {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        4
    }

    /// Value used by the C ABI (`INCCL_INT32`, `INCCL_FLOAT32`).
    pub const fn to_c(self) -> i32 {
        match self {
            DataType::Int32 => 0,
            DataType::Float32 => 1,
        }
    }

    /// Parse the C ABI value.
    pub fn from_c(v: i32) -> Option<Self> {
        match v {
            0 => Some(DataType::Int32),
            1 => Some(DataType::Float32),
            _ => None,
        }
    }

    pub(crate) fn to_wire(self) -> inc_wire::DataType {
        match self {
            DataType::Int32 => inc_wire::DataType::Int32,
            DataType::Float32 => inc_wire::DataType::Float32,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataType::Int32 => "int32",
            DataType::Float32 => "float32",
        })
    }
}

impl FromStr for DataType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "int32" | "int" | "i32" => Ok(DataType::Int32),
            "float32" | "float" | "f32" => Ok(DataType::Float32),
            _ => Err(format!("unknown datatype `{s}` (expected int32 or float32)")),
        }
    }
}

/// Reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (INT32 wraps; FLOAT32 IEEE).
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

impl ReduceOp {
    /// Value used by the C ABI (`INCCL_SUM`, `INCCL_MAX`, `INCCL_MIN`); equal to the
    /// operator field of the INC immediate.
    pub const fn to_c(self) -> i32 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
        }
    }

    /// Parse the C ABI value.
    pub fn from_c(v: i32) -> Option<Self> {
        match v {
            1 => Some(ReduceOp::Sum),
            2 => Some(ReduceOp::Max),
            3 => Some(ReduceOp::Min),
            _ => None,
        }
    }

    pub(crate) fn to_wire(self) -> inc_wire::Operator {
        match self {
            ReduceOp::Sum => inc_wire::Operator::Sum,
            ReduceOp::Max => inc_wire::Operator::Max,
            ReduceOp::Min => inc_wire::Operator::Min,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        })
    }
}

impl FromStr for ReduceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "sum" => Ok(ReduceOp::Sum),
            "max" => Ok(ReduceOp::Max),
            "min" => Ok(ReduceOp::Min),
            _ => Err(format!("unknown operator `{s}` (expected sum, max or min)")),
        }
    }
}

/// A Rust element type usable in typed collectives (`i32`, `f32`).
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The matching [`DataType`].
    const DTYPE: DataType;
}

impl Element for i32 {
    const DTYPE: DataType = DataType::Int32;
}

impl Element for f32 {
    const DTYPE: DataType = DataType::Float32;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for i32 {}
    impl Sealed for f32 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_values_round_trip() {
        for d in [DataType::Int32, DataType::Float32] {
            assert_eq!(DataType::from_c(d.to_c()), Some(d));
            assert_eq!(d.to_string().parse::<DataType>(), Ok(d));
        }
        for o in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            assert_eq!(ReduceOp::from_c(o.to_c()), Some(o));
            assert_eq!(o.to_string().parse::<ReduceOp>(), Ok(o));
        }
        assert_eq!(DataType::from_c(7), None);
        assert_eq!(ReduceOp::from_c(0), None);
        assert!("avg".parse::<ReduceOp>().unwrap_err().contains("avg"));
    }
}
