//! The element types and reduction operators of INC collectives, each defined by one
//! row of a table.
//!
//! [`datatypes!`] (in the style of s2n-quic's `frames!`) turns one row per type into
//! [`DataType`], [`DataType::ALL`], the size, name, class and wire code, `FromStr` and
//! `Display`, and [`DataType::visit`], which hands the row's Rust type to generic code
//! (the reduce kernels are generic over [`crate::reduce::Elem`]). [`operators!`] does
//! the same for [`Operator`], including which types each operator applies to. Adding a
//! type or an operator is one row here (plus its `Elem` impl when the Rust type is new);
//! the immediate encoding, the kernels, their SIMD builds and their tests iterate the
//! tables.

use core::fmt;
use core::str::FromStr;

/// What kind of number a [`DataType`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Two's complement integer: SUM and PROD wrap, MAX/MIN compare as signed.
    Signed,
    /// Unsigned integer: SUM and PROD wrap, MAX/MIN compare as unsigned.
    Unsigned,
    /// IEEE 754 binary float.
    Float,
}

/// Receives the Rust type of a [`DataType`] row (see [`DataType::visit`]).
pub trait TypeVisitor {
    /// What the visit returns.
    type Output;
    /// Called with `E` = the row's Rust type.
    fn visit<E: crate::reduce::Elem>(self) -> Self::Output;
}

macro_rules! datatypes {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $code:literal, $rust:ty, size $size:literal, acc $acc:literal,
            $name:literal $(| $alias:literal)*, $class:ident;
    )*) => {
        /// Element type of a collective (the immediate's datatype code). Payload
        /// elements travel in network byte order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum DataType {
            $($(#[$doc])* $variant = $code,)*
        }

        impl DataType {
            /// Every type, in table order.
            pub const ALL: &'static [DataType] = &[$(DataType::$variant,)*];

            /// Size of one element in bytes.
            pub const fn size(self) -> usize {
                match self { $(DataType::$variant => $size,)* }
            }

            /// Bytes per element of a switch's accumulator: 4 (fp32) for the half
            /// types, which a switch accumulates in fp32 and rounds once per hop,
            /// otherwise [`Self::size`].
            pub const fn acc_size(self) -> usize {
                match self { $(DataType::$variant => $acc,)* }
            }

            /// Lower-case name (`int32`, `bfloat16`, ...), as parsed by `FromStr`.
            pub const fn name(self) -> &'static str {
                match self { $(DataType::$variant => $name,)* }
            }

            /// Signed, unsigned or float.
            pub const fn class(self) -> Class {
                match self { $(DataType::$variant => Class::$class,)* }
            }

            /// The 4-bit code in the immediate's datatype field (also the C ABI value).
            pub const fn code(self) -> u8 {
                self as u8
            }

            /// The type with wire code `code`.
            pub const fn from_code(code: u8) -> Option<DataType> {
                match code { $($code => Some(DataType::$variant),)* _ => None }
            }

            /// Calls `v.visit::<E>()` with `E` the Rust type of this row.
            #[inline(always)]
            pub fn visit<V: TypeVisitor>(self, v: V) -> V::Output {
                match self { $(DataType::$variant => v.visit::<$rust>(),)* }
            }

            fn parse_name(s: &str) -> Option<DataType> {
                match s { $($name $(| $alias)* => Some(DataType::$variant),)* _ => None }
            }
        }

        // Each row's size is its Rust type's size, and its accumulator is either the
        // element itself or fp32.
        const _: () = {
            $(
                assert!(core::mem::size_of::<$rust>() == $size);
                assert!($acc == $size || $acc == 4);
                assert!($code < 16);
            )*
        };
    };
}

datatypes! {
    /// 32-bit two's complement integer.
    Int32 = 0, i32, size 4, acc 4, "int32" | "int" | "i32", Signed;
    /// IEEE 754 binary32.
    Float32 = 1, f32, size 4, acc 4, "float32" | "float" | "f32", Float;
    /// 8-bit two's complement integer.
    Int8 = 2, i8, size 1, acc 1, "int8" | "i8", Signed;
    /// 8-bit unsigned integer.
    Uint8 = 3, u8, size 1, acc 1, "uint8" | "u8", Unsigned;
    /// 32-bit unsigned integer.
    Uint32 = 4, u32, size 4, acc 4, "uint32" | "u32", Unsigned;
    /// 64-bit two's complement integer.
    Int64 = 5, i64, size 8, acc 8, "int64" | "i64", Signed;
    /// 64-bit unsigned integer.
    Uint64 = 6, u64, size 8, acc 8, "uint64" | "u64", Unsigned;
    /// IEEE 754 binary16; switches accumulate in fp32.
    Float16 = 7, half::f16, size 2, acc 4, "float16" | "fp16" | "f16" | "half", Float;
    /// bfloat16 (the upper half of a binary32); switches accumulate in fp32.
    Bfloat16 = 8, half::bf16, size 2, acc 4, "bfloat16" | "bf16", Float;
    /// IEEE 754 binary64.
    Float64 = 9, f64, size 8, acc 8, "float64" | "double" | "f64", Float;
}

impl DataType {
    /// Whether this is an integer type (signed or unsigned).
    pub const fn is_integer(self) -> bool {
        !matches!(self.class(), Class::Float)
    }

    /// Whether a switch accumulates this type in fp32 ([`Self::acc_size`] differs
    /// from [`Self::size`]).
    pub const fn accumulates_in_f32(self) -> bool {
        self.acc_size() != self.size()
    }
}

/// Which element types an operator applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AppliesTo {
    /// Every type (Barrier carries no data, so its type is irrelevant).
    Any,
    /// Integer types only (the bitwise operators).
    Integers,
}

macro_rules! operators {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $code:literal, $name:literal, $applies:ident, wire $wire:ident;
    )*) => {
        /// Reduction operator of a collective (the immediate's operator code).
        /// `Barrier` carries no data.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Operator {
            $($(#[$doc])* $variant = $code,)*
        }

        impl Operator {
            /// Every operator, in table order (Barrier first).
            pub const ALL: &'static [Operator] = &[$(Operator::$variant,)*];

            /// Lower-case name (`sum`, `bxor`, ...), as parsed by `FromStr`.
            pub const fn name(self) -> &'static str {
                match self { $(Operator::$variant => $name,)* }
            }

            /// The types this operator applies to.
            pub const fn applies(self) -> AppliesTo {
                match self { $(Operator::$variant => AppliesTo::$applies,)* }
            }

            /// What a switch computes: [`Operator::Avg`] is [`Operator::Sum`] in the
            /// network (the hosts divide by the world size at the end).
            pub const fn in_network(self) -> Operator {
                match self { $(Operator::$variant => Operator::$wire,)* }
            }

            /// The 4-bit operator code of the immediate (also the C ABI value).
            pub const fn code(self) -> u8 {
                self as u8
            }

            /// The operator with code `code`.
            pub const fn from_code(code: u8) -> Option<Operator> {
                match code { $($code => Some(Operator::$variant),)* _ => None }
            }
        }

        const _: () = { $(assert!($code < 16);)* };
    };
}

operators! {
    /// No data: a barrier.
    Barrier = 0, "barrier", Any, wire Barrier;
    /// Sum (integers wrap; floats IEEE).
    Sum = 1, "sum", Any, wire Sum;
    /// Maximum (signed or unsigned by type; floats with -0 < +0, NaN wins).
    Max = 2, "max", Any, wire Max;
    /// Minimum.
    Min = 3, "min", Any, wire Min;
    /// Product (integers wrap; floats IEEE).
    Prod = 4, "prod", Any, wire Prod;
    /// Average: summed in the network, divided by the world size on the hosts.
    Avg = 5, "avg", Any, wire Sum;
    /// Bitwise AND.
    Band = 6, "band", Integers, wire Band;
    /// Bitwise OR.
    Bor = 7, "bor", Integers, wire Bor;
    /// Bitwise XOR.
    Bxor = 8, "bxor", Integers, wire Bxor;
}

impl Operator {
    /// The operators that reduce data (all but Barrier).
    pub fn reductions() -> impl Iterator<Item = Operator> {
        Operator::ALL.iter().copied().filter(|o| *o != Operator::Barrier)
    }

    /// Whether this operator applies to `dtype`.
    pub const fn applies_to(self, dtype: DataType) -> bool {
        match self.applies() {
            AppliesTo::Any => true,
            AppliesTo::Integers => dtype.is_integer(),
        }
    }

    /// `Ok` if this operator applies to `dtype`, else the error naming both.
    pub fn check(self, dtype: DataType) -> Result<(), Unsupported> {
        if self.applies_to(dtype) {
            Ok(())
        } else {
            Err(Unsupported { operator: self, datatype: dtype })
        }
    }
}

/// An operator that does not apply to a type (a bitwise operator on a float type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("operator {operator} does not apply to datatype {datatype} ({})", match operator.applies() {
    AppliesTo::Integers => "integer types only",
    AppliesTo::Any => "any type",
})]
pub struct Unsupported {
    /// The operator.
    pub operator: Operator,
    /// The type it does not apply to.
    pub datatype: DataType,
}

/// A name that is no type or operator of the tables; lists the valid names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{name}` (expected one of: {expected})")]
pub struct UnknownName {
    /// "datatype" or "operator".
    pub what: &'static str,
    /// What was given.
    pub name: String,
    /// The valid names, comma separated.
    pub expected: String,
}

fn names<T: Copy>(all: &[T], name: impl Fn(T) -> &'static str) -> String {
    all.iter().map(|t| name(*t)).collect::<Vec<_>>().join(", ")
}

impl FromStr for DataType {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<DataType, UnknownName> {
        DataType::parse_name(&s.to_ascii_lowercase()).ok_or_else(|| UnknownName {
            what: "datatype",
            name: s.to_string(),
            expected: names(DataType::ALL, DataType::name),
        })
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Operator {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Operator, UnknownName> {
        let l = s.to_ascii_lowercase();
        Operator::ALL.iter().copied().find(|o| o.name() == l).ok_or_else(|| UnknownName {
            what: "operator",
            name: s.to_string(),
            expected: names(Operator::ALL, Operator::name),
        })
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_consistent() {
        assert_eq!(DataType::Int32.code(), 0, "seed value");
        assert_eq!(DataType::Float32.code(), 1, "seed value");
        assert_eq!(DataType::ALL.len(), 10);
        for (i, d) in DataType::ALL.iter().enumerate() {
            assert_eq!(d.code() as usize, i, "codes are dense, in table order");
            assert_eq!(DataType::from_code(d.code()), Some(*d));
            assert_eq!(d.to_string().parse::<DataType>(), Ok(*d));
            assert_eq!(d.name().to_uppercase().parse::<DataType>(), Ok(*d));
        }
        assert_eq!(DataType::from_code(10), None);
        assert_eq!((Operator::Sum.code(), Operator::Max.code(), Operator::Min.code()), (1, 2, 3));
        for (i, o) in Operator::ALL.iter().enumerate() {
            assert_eq!(o.code() as usize, i);
            assert_eq!(Operator::from_code(o.code()), Some(*o));
            assert_eq!(o.to_string().parse::<Operator>(), Ok(*o));
        }
        assert_eq!(Operator::from_code(9), None);
        assert_eq!(Operator::Avg.in_network(), Operator::Sum);
        assert_eq!(DataType::Bfloat16.size(), 2);
        assert_eq!(DataType::Bfloat16.acc_size(), 4);
        assert!(DataType::Float16.accumulates_in_f32());
        assert!(!DataType::Float64.accumulates_in_f32());
    }

    #[test]
    fn bitwise_only_on_integers() {
        for o in Operator::ALL {
            for d in DataType::ALL {
                let bitwise = matches!(o, Operator::Band | Operator::Bor | Operator::Bxor);
                assert_eq!(o.applies_to(*d), !bitwise || d.is_integer(), "{o} {d}");
            }
        }
        let e = Operator::Bxor.check(DataType::Bfloat16).unwrap_err();
        assert_eq!(
            e.to_string(),
            "operator bxor does not apply to datatype bfloat16 (integer types only)"
        );
    }

    #[test]
    fn unknown_names_list_the_valid_ones() {
        let e = "int16".parse::<DataType>().unwrap_err().to_string();
        assert!(e.contains("int16") && e.contains("bfloat16") && e.contains("uint64"), "{e}");
        let e = "mean".parse::<Operator>().unwrap_err().to_string();
        assert!(e.contains("mean") && e.contains("bxor"), "{e}");
    }
}
