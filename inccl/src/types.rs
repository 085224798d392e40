//! Element types and reduction operators of the public API: the tables of `inc-wire`
//! (`inc_wire::dtype`), re-exported, so a type or operator added there is one here, in
//! the C ABI (`inccl.h` values are the table codes) and in the host programs.

pub use inc_wire::{DataType, Operator as ReduceOp};

/// A Rust element type usable in typed collectives: the Rust type of every row of the
/// datatype table (`i8`, `u8`, `i32`, `u32`, `i64`, `u64`, `half::f16`, `half::bf16`,
/// `f32`, `f64`).
pub trait Element: bytemuck::Pod + inc_wire::reduce::Elem {}

impl<T: bytemuck::Pod + inc_wire::reduce::Elem> Element for T {}

/// Why `op` cannot reduce `dtype` (Barrier is not a reduction; the bitwise operators
/// take integers only), or `None`.
pub(crate) fn refuse(op: ReduceOp, dtype: DataType) -> Option<String> {
    if op == ReduceOp::Barrier {
        return Some(format!("operator {op} is not a reduction (use barrier())"));
    }
    op.check(dtype).err().map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dtype_of<T: Element>() -> DataType {
        T::DTYPE
    }

    #[test]
    fn every_table_row_is_an_element() {
        let rust = [
            dtype_of::<i32>(),
            dtype_of::<f32>(),
            dtype_of::<i8>(),
            dtype_of::<u8>(),
            dtype_of::<u32>(),
            dtype_of::<i64>(),
            dtype_of::<u64>(),
            dtype_of::<half::f16>(),
            dtype_of::<half::bf16>(),
            dtype_of::<f64>(),
        ];
        assert_eq!(rust.as_slice(), DataType::ALL);
    }

    #[test]
    fn names_and_refusals() {
        for d in DataType::ALL {
            assert_eq!(d.to_string().parse::<DataType>(), Ok(*d));
        }
        for o in ReduceOp::ALL {
            assert_eq!(o.to_string().parse::<ReduceOp>(), Ok(*o));
        }
        assert!("mean".parse::<ReduceOp>().unwrap_err().to_string().contains("avg"));
        let why = refuse(ReduceOp::Band, DataType::Float32).unwrap();
        assert!(why.contains("band") && why.contains("float32"), "{why}");
        assert!(refuse(ReduceOp::Barrier, DataType::Int32).is_some());
        assert_eq!(refuse(ReduceOp::Bxor, DataType::Uint8), None);
        assert_eq!(refuse(ReduceOp::Avg, DataType::Bfloat16), None);
    }
}
