//! The element types a tensor can have, and the typed views of tensors they give.

use cudarc::driver::CudaSlice;
use half::{bf16, f16};

use super::device::{Consumers, DeviceData, DeviceTensor};
use super::host::{HostData, HostTensor};
use crate::options::DType;

/// An element type a tensor can have: `half::f16`, `half::bf16` or `f32` (images, tokens),
/// `i32` or `i64` (a patch sequence's side tensors), `u8` (masks). Names the cudarc slice (and host slice) of
/// that type inside a tensor.
pub trait Element: cudarc::driver::DeviceRepr + Copy + sealed::Sealed + 'static {
    /// The [`DType`] of this element type.
    const DTYPE: DType;
    /// The slice, if `data` holds this type.
    fn device_slice(data: &DeviceData) -> Option<&CudaSlice<Self>>;
    /// The slice, if `data` holds this type; `data` back otherwise.
    fn into_device_slice(data: DeviceData) -> std::result::Result<CudaSlice<Self>, DeviceData>;
    /// The elements, if `data` holds this type.
    fn host_slice(data: &HostData) -> Option<&[Self]>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
    impl Sealed for u8 {}
}

macro_rules! element {
    ($ty:ty, $variant:ident) => {
        impl Element for $ty {
            const DTYPE: DType = DType::$variant;
            fn device_slice(data: &DeviceData) -> Option<&CudaSlice<Self>> {
                match data {
                    DeviceData::$variant(s) => Some(s),
                    _ => None,
                }
            }
            fn into_device_slice(
                data: DeviceData,
            ) -> std::result::Result<CudaSlice<Self>, DeviceData> {
                match data {
                    DeviceData::$variant(s) => Ok(s),
                    other => Err(other),
                }
            }
            fn host_slice(data: &HostData) -> Option<&[Self]> {
                match data {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

element!(f16, F16);
element!(bf16, BF16);
element!(f32, F32);
element!(i32, I32);
element!(i64, I64);
element!(u8, U8);

impl DeviceTensor {
    /// The cudarc slice of element type `T`, or `None` if the tensor holds another type:
    /// `tensor.as_slice::<half::f16>()`.
    pub fn as_slice<T: Element>(&self) -> Option<&CudaSlice<T>> {
        T::device_slice(self.data())
    }

    /// [`DeviceTensor::into_data`] for element type `T`; the tensor back if it holds another.
    pub fn into_slice<T: Element>(self) -> std::result::Result<CudaSlice<T>, DeviceTensor> {
        if self.dtype() != T::DTYPE {
            return Err(self);
        }
        let DeviceTensor {
            consumers,
            data,
            shape,
            layout,
        } = self;
        if consumers.release().is_err() {
            // The memory stays with a tensor, whose drop orders it again.
            return Err(DeviceTensor {
                consumers,
                data,
                shape,
                layout,
            });
        }
        T::into_device_slice(data).map_err(|data| DeviceTensor {
            consumers: Box::new(Consumers::new(data.stream())),
            data,
            shape,
            layout,
        })
    }
}

impl HostTensor {
    /// The elements as a slice of `T`, or `None` if the tensor holds another type:
    /// `tensor.as_slice::<f32>()`.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::host_slice(self.data())
    }
}
