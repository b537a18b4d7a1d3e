"""classify(): kernel names from cuDNN, cuBLAS(Lt), CUTLASS, Eigen, TensorFlow, oneDNN,
PyTorch (ATen, Triton, CPU ops), ROCm, NCCL and the real traces in ../shared/traces, each
with the category a person reading the profile would give it."""

from __future__ import annotations

import random
import string

import pytest
from fixtures_traces import SHARED_TRACES, real_traces, require_real_traces

from detprof.traces.classify import CATEGORIES, classify

CONV_FWD = "conv forward"
CONV_DATA = "conv backward data"
CONV_FILTER = "conv backward filter"
GEMM = "gemm/matmul"
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
BN = "batch-norm"
POOL = "pooling"
SOFTMAX = "softmax/loss"
RECURRENT = "recurrent"
OPTIMIZER = "optimizer update"
MEMORY = "memory"
COMMUNICATION = "communication"
OTHER = "other"

# Real names as profilers print them (demangled, with argument lists).
KERNELS: list[tuple[str, str]] = [
    # Recurrent layers: cuDNN's persistent RNN and its LSTM/GRU gate kernels (named cuDNN, not convolutions),
    # PyTorch's fused cells.
    ("void RNN_blockPersist_fp_LSTM<float, float, float, 128>(cudnnRNNPersistLaunchParams)", RECURRENT),
    ("void LSTM_elementWise_fp<float, float, float>(int, int, int, int, float const*, float*)", RECURRENT),
    ("void GRU_elementWise_bp1<float, float, float>(int, int, int, float*, float const*)", RECURRENT),
    ("void elemWiseRNNcell<float, float, float, (cudnnRNNMode_t)2, (cudnnRNNBiasMode_t)2>(int, int)", RECURRENT),
    ("void at::native::(anonymous namespace)::lstm_cell_forward<float, float, int, 4>(...)", RECURRENT),
    ("void at::native::(anonymous namespace)::gru_cell_backward<float, float, int, 4>(...)", RECURRENT),
    # cuDNN convolution
    (
        "void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, true, false, true>"
        "(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, in"
        "t, "
        "float, float, int, float const*, float const*, bool, int, int)",
        CONV_FWD,
    ),
    (
        "void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float cons"
        "t*, "
        "int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)",
        CONV_FILTER,
    ),
    (
        "void cudnn::detail::dgrad_engine<float, 128, 6, 7, 3, 3, 5, false>(int, int, int, float const*, int"
        ", "
        "float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, fl"
        "oat, "
        "int, int, int)",
        CONV_DATA,
    ),
    (
        "void cudnn::detail::dgrad2d_alg1_1<float, 0, 4, 6, 3, 2, 4, 0, true>(int, int, int, float const*, i"
        "nt, "
        "float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, fl"
        "oat, "
        "int, int)",
        CONV_DATA,
    ),
    (
        "sm80_xmma_dgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize64x32x64_stage5_"
        "warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn",
        CONV_DATA,
    ),
    (
        "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_warpsize2"
        "x2x1_"
        "g1_tensor16x8x8_t1r3s3_execute_kernel_cudnn",
        CONV_FWD,
    ),
    (
        "sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage3_"
        "warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn",
        CONV_FILTER,
    ),
    (
        "void xmma_cudnn::gemm::kernel<xmma_cudnn::implicit_gemm::fprop_indexed::Kernel_traits<"
        "xmma_cudnn::Ampere_hmma_fp32_traits, xmma_cudnn::Cta_tile<xmma_cudnn::Ampere, 64, 64, 64, 2, 2, 1, "
        "1>, "
        "xmma_cudnn::implicit_gemm::fprop_indexed::Gmem_tile_a_t<xmma_cudnn::Ampere_hmma_fp32_traits>, 4>, f"
        "alse>"
        "(xmma_cudnn::implicit_gemm::fprop_indexed::Params)",
        CONV_FWD,
    ),
    (
        "void convolve_common_engine_float_NHWC<float, float, 512, 6, 8, 3, 3, 5, false>(int, int, int, "
        "float const*, float const*, int, float*, conv_kernel_common_params, unsigned long long, int, float, "
        "float, int, float const*, float const*)",
        CONV_FWD,
    ),
    ("volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", CONV_FWD),
    ("volta_scudnn_128x64_relu_interior_nn_v1", CONV_FWD),
    ("volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", CONV_FWD),
    ("volta_fp16_s884cudnn_fp16_256x128_ldg8_dgrad_f2f_exp_small_nhwc2nchw_tt_v1", CONV_DATA),
    ("volta_fp16_s884cudnn_fp16_128x128_ldg8_wgrad_idx_exp_interior_nhwc_nt_v1", CONV_FILTER),
    ("volta_scudnn_128x128_stridedB_splitK_interior_nn_v1", CONV_FILTER),
    (
        "void cudnn::winograd::generateWinogradTilesKernel<0, float, float>"
        "(cudnn::winograd::GenerateWinogradTilesParams<float, float>)",
        CONV_FWD,
    ),
    (
        "void cudnn::winograd_nonfused::winogradWgradData4x4<float, float>"
        "(cudnn::winograd_nonfused::WinogradDataParams<float, float>)",
        CONV_FILTER,
    ),
    (
        "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>"
        "(cudnn::winograd_nonfused::WinogradDataParams<float, float>)",
        CONV_FWD,
    ),
    # The argument list names cudnn::reduced_divisor: not a reduction.
    (
        "void fft2d_r2c_32x32<float, false, 1u, false>(float2*, float const*, int, int, int, int, int, int, "
        "int, "
        "int, int, cudnn::reduced_divisor, bool, int2, int, int)",
        CONV_FWD,
    ),
    ("void flip_filter<float, float>(float*, float const*, int, int, int, int)", CONV_DATA),
    (
        "void cudnn::gemm::computeOffsetsKernel<false, false>(cudnn::gemm::ComputeOffsetsParams)",
        CONV_FWD,
    ),
    (
        "void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>"
        "(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)",
        MEMORY,
    ),
    (
        "void cudnn::ops::scalePackedTensor_kernel<float, float>(cudnnTensor4dStruct, float*, float)",
        ELEMENTWISE,
    ),
    # cuDNN batch norm, pooling, softmax
    (
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>(cudnnTensorStruct, float const*, "
        "cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*"
        ", "
        "float, float)",
        BN,
    ),
    (
        "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float, float, float, "
        "cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, "
        "float const*, float*, float*, float const*, float const*, float)",
        BN,
    ),
    (
        "void cudnn::batchnorm_fwtr_nhwc_semiPersist<__half, float, float, 512, 32, 4, false, true>"
        "(cudnn::batchnorm_nhwc_params)",
        BN,
    ),
    (
        "void cudnn::pooling_fw_4d_kernel<float, float, cudnn::maxpooling_func<float, (cudnnNanPropagation_t"
        ")0>, "
        "0, false>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, cudnnPoolingStruct, float, fl"
        "oat, "
        "int, cudnn::reduced_divisor, cudnn::reduced_divisor)",
        POOL,
    ),
    (
        "void cudnn::pooling_bw_kernel_max_nchw_fully_packed_small<float, float, 2, (cudnnNanPropagation_t)0>"
        "(cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, "
        "cudnnTensorStruct, float*, float, float, cudnnPoolingStruct, int, cudnn::reduced_divisor, int)",
        POOL,
    ),
    (
        "void cudnn::detail::softmax_fw_kernel<2, float, float, 256, 1, 0, 0, true>(cudnnTensorStruct, "
        "float const*, cudnnTensorStruct, float*, float, float)",
        SOFTMAX,
    ),
    # cuBLAS / cuBLASLt
    ("volta_sgemm_128x64_nn", GEMM),
    ("ampere_sgemm_128x64_tn", GEMM),
    ("volta_h884gemm_256x128_ldg8_nn", GEMM),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", GEMM),
    (
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_"
        "kernel__5x_cublas",
        GEMM,
    ),
    (
        "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, "
        "cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >"
        "(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>, float, "
        "float)",
        GEMM,
    ),
    (
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, false, false>"
        "(cublasLt::cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const"
        "*, "
        "float const*, float const*, float*, void*, long, float*, int*)",
        GEMM,
    ),
    (
        "void gemmSN_NN_kernel<float, 256, 4, 2, 8, 3, 4, false, cublasGemvTensorStridedBatched<float const>"
        ", "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float> >"
        "(cublasGemmSmallNParams<cublasGemvTensorStridedBatched<float const>, "
        "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>)",
        GEMM,
    ),
    # CUTLASS
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"
        "(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
        GEMM,
    ),
    (
        "void cutlass::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4>"
        "(cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4::Params)",
        CONV_FWD,
    ),
    (
        "void cutlass::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_64x64_16x10_nhwc_unity_stride_align"
        "4>"
        "(cutlass_tensorop_s1688dgrad_optimized_tf32_64x64_16x10_nhwc_unity_stride_align4::Params)",
        CONV_DATA,
    ),
    (
        "void cutlass::Kernel<cutlass_tensorop_s1688wgrad_optimized_tf32_64x64_16x10_nhwc_align4>"
        "(cutlass_tensorop_s1688wgrad_optimized_tf32_64x64_16x10_nhwc_align4::Params)",
        CONV_FILTER,
    ),
    # Eigen on GPU
    (
        "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<"
        "Eigen::Tensor<float, 1, 1, int>, 16, Eigen::MakePointer>, Eigen::TensorReductionOp<"
        "Eigen::internal::SumReducer<float>, Eigen::IndexList<Eigen::type2index<0l> > const, Eigen::TensorMa"
        "p<"
        "Eigen::Tensor<float const, 2, 1, int>, 16, Eigen::MakePointer> const, Eigen::MakePointer> const> co"
        "nst, "
        "Eigen::GpuDevice>, int>(Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<Eigen::Tensor<"
        "float, 1, 1, int>, 16, Eigen::MakePointer>, Eigen::TensorReductionOp<Eigen::internal::SumReducer<fl"
        "oat>, "
        "Eigen::IndexList<Eigen::type2index<0l> > const, Eigen::TensorMap<Eigen::Tensor<float const, 2, 1, i"
        "nt>, "
        "16, Eigen::MakePointer> const, Eigen::MakePointer> const> const, Eigen::GpuDevice>, int)",
        REDUCTION,
    ),
    (
        "void Eigen::internal::FullReductionKernel<256, 128, Eigen::TensorReductionEvaluatorBase<"
        "Eigen::TensorReductionOp<Eigen::internal::MaxReducer<float, 0>, Eigen::DimensionList<long, 1ul> con"
        "st, "
        "Eigen::TensorMap<Eigen::Tensor<float const, 1, 1, long>, 16, Eigen::MakePointer> const, "
        "Eigen::MakePointer> const, Eigen::GpuDevice>, Eigen::internal::MaxReducer<float, 0>, long>"
        "(Eigen::internal::MaxReducer<float, 0>, Eigen::TensorReductionEvaluatorBase<Eigen::TensorReductionO"
        "p<"
        "Eigen::internal::MaxReducer<float, 0>, Eigen::DimensionList<long, 1ul> const, Eigen::TensorMap<"
        "Eigen::Tensor<float const, 1, 1, long>, 16, Eigen::MakePointer> const, Eigen::MakePointer> const, "
        "Eigen::GpuDevice>, long, float*, unsigned int*)",
        REDUCTION,
    ),
    # scalar_sum_op inside a TensorCwiseBinaryOp is a + b (AddV2), not a sum reduction.
    (
        "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<"
        "Eigen::Tensor<float, 1, 1, long>, 16, Eigen::MakePointer>, Eigen::TensorCwiseBinaryOp<"
        "Eigen::internal::scalar_sum_op<float const, float const>, Eigen::TensorMap<Eigen::Tensor<float cons"
        "t, 1, "
        "1, long>, 16, Eigen::MakePointer> const, Eigen::TensorMap<Eigen::Tensor<float const, 1, 1, long>, 1"
        "6, "
        "Eigen::MakePointer> const> const> const, Eigen::GpuDevice>, long>(Eigen::TensorEvaluator<"
        "Eigen::TensorAssignOp<Eigen::TensorMap<Eigen::Tensor<float, 1, 1, long>, 16, Eigen::MakePointer>, "
        "Eigen::TensorCwiseBinaryOp<Eigen::internal::scalar_sum_op<float const, float const>, Eigen::TensorM"
        "ap<"
        "Eigen::Tensor<float const, 1, 1, long>, 16, Eigen::MakePointer> const, Eigen::TensorMap<Eigen::Tens"
        "or<"
        "float const, 1, 1, long>, 16, Eigen::MakePointer> const> const> const, Eigen::GpuDevice>, long)",
        ELEMENTWISE,
    ),
    (
        "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<"
        "Eigen::Tensor<float, 1, 1, long>, 16, Eigen::MakePointer>, Eigen::TensorCwiseBinaryOp<"
        "Eigen::internal::scalar_max_op<float const, float const, 0>, Eigen::TensorMap<Eigen::Tensor<float c"
        "onst, "
        "1, 1, long>, 16, Eigen::MakePointer> const, Eigen::TensorCwiseNullaryOp<Eigen::internal::scalar_con"
        "stant_op"
        "<float const>, Eigen::TensorMap<Eigen::Tensor<float const, 1, 1, long>, 16, Eigen::MakePointer> con"
        "st> "
        "const> const> const, Eigen::GpuDevice>, long>(Eigen::TensorEvaluator<Eigen::TensorAssignOp<"
        "Eigen::TensorMap<Eigen::Tensor<float, 1, 1, long>, 16, Eigen::MakePointer>, Eigen::TensorCwiseBinar"
        "yOp<"
        "Eigen::internal::scalar_max_op<float const, float const, 0>, Eigen::TensorMap<Eigen::Tensor<float c"
        "onst, "
        "1, 1, long>, 16, Eigen::MakePointer> const, Eigen::TensorCwiseNullaryOp<Eigen::internal::scalar_con"
        "stant_op"
        "<float const>, Eigen::TensorMap<Eigen::Tensor<float const, 1, 1, long>, 16, Eigen::MakePointer> con"
        "st> "
        "const> const> const, Eigen::GpuDevice>, long)",
        ELEMENTWISE,
    ),
    # Real kernel names of ../shared/traces/tf-bert-3gpu.xplane.pb (TF ops Cast, BroadcastTo, RandomUniform).
    (
        "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<"
        "Eigen::Tensor<Eigen::half, 1, 1, long>, 16, Eigen::MakePointer>, Eigen::TensorConversionOp<Eigen::h"
        "alf, "
        "Eigen::TensorMap<Eigen::Tensor<float const, 1, 1, long>, 16, Eigen::MakePointer> const> const> cons"
        "t, "
        "Eigen::GpuDevice>, long>(Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<Eigen::Tenso"
        "r<"
        "Eigen::half, 1, 1, long>, 16, Eigen::MakePointer>, Eigen::TensorConversionOp<Eigen::half, "
        "Eigen::TensorMap<Eigen::Tensor<float const, 1, 1, long>, 16, Eigen::MakePointer> const> const> cons"
        "t, "
        "Eigen::GpuDevice>, long)",
        ELEMENTWISE,
    ),
    (
        "void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<Eigen::TensorMap<"
        "Eigen::Tensor<Eigen::half, 2, 1, int>, 16, Eigen::MakePointer>, Eigen::TensorBroadcastingOp<"
        "Eigen::array<int, 2ul> const, Eigen::TensorMap<Eigen::Tensor<Eigen::half const, 2, 1, int>, 16, "
        "Eigen::MakePointer> const> const> const, Eigen::GpuDevice>, int>(Eigen::TensorEvaluator<"
        "Eigen::TensorAssignOp<Eigen::TensorMap<Eigen::Tensor<Eigen::half, 2, 1, int>, 16, Eigen::MakePointe"
        "r>, "
        "Eigen::TensorBroadcastingOp<Eigen::array<int, 2ul> const, Eigen::TensorMap<Eigen::Tensor<Eigen::hal"
        "f "
        "const, 2, 1, int>, 16, Eigen::MakePointer> const> const> const, Eigen::GpuDevice>, int)",
        MEMORY,
    ),
    (
        "void tensorflow::functor::FillPhiloxRandomKernelLaunch<tensorflow::random::UniformDistribution<"
        "tensorflow::random::PhiloxRandom, Eigen::half> >(unsigned long long const*, unsigned long long cons"
        "t*, "
        "tensorflow::random::PhiloxRandom, tensorflow::random::UniformDistribution<tensorflow::random::Philo"
        "xRandom,"
        " Eigen::half>::ResultElementType*, long long, tensorflow::random::UniformDistribution<"
        "tensorflow::random::PhiloxRandom, Eigen::half>)",
        ELEMENTWISE,
    ),
    # TensorFlow's own GPU kernels
    (
        "void tensorflow::functor::BiasGradNHWC_SharedAtomics<float>(int, float const*, float*, int)",
        REDUCTION,
    ),
    (
        "void tensorflow::functor::BiasGradNCHW_SharedAtomics<float>(float const*, float*, int, int, int)",
        REDUCTION,
    ),
    (
        "void tensorflow::functor::BiasNHWCKernel<float>(int, float const*, float const*, float*, int)",
        ELEMENTWISE,
    ),
    (
        "void tensorflow::functor::ColumnReduceKernel<float const*, float*, cub::Sum>(float const*, float*, "
        "int, "
        "int, cub::Sum, std::iterator_traits<float const*>::value_type)",
        REDUCTION,
    ),
    (
        "void tensorflow::functor::RowReduceKernel<float const*, float*, cub::Sum>(float const*, float*, int"
        ", int, "
        "cub::Sum, std::iterator_traits<float const*>::value_type)",
        REDUCTION,
    ),
    (
        "void tensorflow::functor::BlockReduceKernel<float const*, float*, 256, tensorflow::functor::Sum<flo"
        "at> >"
        "(float const*, float*, int, tensorflow::functor::Sum<float>, "
        "std::iterator_traits<float const*>::value_type)",
        REDUCTION,
    ),
    (
        "void tensorflow::(anonymous namespace)::GenerateNormalizedProb<float, float, 4>(float const*, "
        "float const*, float const*, float*, int, int, bool)",
        SOFTMAX,
    ),
    (
        "void tensorflow::(anonymous namespace)::SoftmaxXentWithLogitsKernel<float>(int, float const*)",
        SOFTMAX,
    ),
    (
        "void tensorflow::functor::ApplyAdamKernel<float>(int, float*, float*, float*, float const*, float c"
        "onst*, "
        "float const*, float const*, float const*, float const*, float const*)",
        OPTIMIZER,
    ),
    (
        "void tensorflow::(anonymous namespace)::MaxPoolBackward<float>(int, float const*, int const*, float"
        "*, "
        "int, int)",
        POOL,
    ),
    (
        "void tensorflow::(anonymous namespace)::MaxPoolGradBackwardNoMaskNHWC<float>(int, float const*, "
        "float const*, int, int, int, int, int, int, int, int, int, int, int, int, float const*, float*)",
        POOL,
    ),
    (
        "void tensorflow::functor::SwapDimension1And2InTensor3UsingTiles<unsigned int, 256, 32, 32, false>"
        "(unsigned int const*, tensorflow::functor::Dimension<3>, unsigned int*)",
        MEMORY,
    ),
    (
        "void tensorflow::functor::ShuffleInTensor3Simple<float, 2, 1, 0, false>(int, float const*, "
        "tensorflow::functor::Dimension<3>, float*)",
        MEMORY,
    ),
    (
        "void tensorflow::DepthwiseConv2dGPUKernelNHWC<float, 3, 3, 1>(tensorflow::DepthwiseArgs, float cons"
        "t*, "
        "float const*, float*, int)",
        CONV_FWD,
    ),
    (
        "void tensorflow::DepthwiseConv2dBackpropFilterGPUKernelNHWC<float, 3, 3, 1>(tensorflow::DepthwiseAr"
        "gs, "
        "float const*, float const*, float*, int)",
        CONV_FILTER,
    ),
    (
        "void tensorflow::DepthwiseConv2dBackpropInputGPUKernelNHWC<float, 3, 3, 1>(tensorflow::DepthwiseArg"
        "s, "
        "float const*, float const*, float*, int)",
        CONV_DATA,
    ),
    (
        "void tensorflow::ScatterNdOpKernel<float, int, 2, (tensorflow::scatter_nd_op::UpdateOp)1>(int const"
        "*, "
        "float const*, float*, tensorflow::Eigen::array<long, 2ul>, tensorflow::Eigen::array<long, 2ul>, lon"
        "g, "
        "long, long)",
        REDUCTION,
    ),
    (
        "void tensorflow::UnsortedSegmentCustomKernel<float, int, tensorflow::functor::AtomicSumOpGpu<float>"
        " >"
        "(long, long, int const*, float const*, float*)",
        REDUCTION,
    ),
    (
        "void tensorflow::GatherOpKernel<float, int, true>(float const*, int const*, float*, long long, long"
        " long, "
        "long long, long long)",
        MEMORY,
    ),
    ("redzone_checker", MEMORY),
    # Memory activity as each profiler names it
    ("[CUDA memcpy HtoD]", MEMORY),
    ("[CUDA memcpy DtoD]", MEMORY),
    ("[CUDA memset]", MEMORY),
    ("MemcpyH2D", MEMORY),
    ("Memset", MEMORY),
    # CUB, NCCL
    (
        "void cub::DeviceReduceKernel<cub::DeviceReducePolicy<float, int, cub::Sum>::Policy600, float*, floa"
        "t*, "
        "int, cub::Sum>(float*, float*, int, cub::GridEvenShare<int>, cub::Sum)",
        REDUCTION,
    ),
    (
        "void cub::DeviceScanKernel<cub::DeviceScanPolicy<int>::Policy600, int*, int*, "
        "cub::ScanTileState<int, true>, cub::Sum, cub::NullType, int>(int*, int*, "
        "cub::ScanTileState<int, true>, int, cub::Sum, cub::NullType, int)",
        REDUCTION,
    ),
    (
        "void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<int, cub::NullType, int>::Policy"
        "800, "
        "false, int, cub::NullType, int, int>(int*, int*, int*, int const*, int*, cub::NullType*, "
        "cub::NullType const*, int, int, int)",
        OTHER,
    ),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", COMMUNICATION),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", COMMUNICATION),
    ("rcclKernel_AllGather_RING_LL_Sum_float(ncclWorkElem)", COMMUNICATION),
    ("all-reduce.3", COMMUNICATION),
    ("reduce-scatter.1", COMMUNICATION),
    ("all-gather-start", COMMUNICATION),
    ("collective-permute-done", COMMUNICATION),
    ("nccl:all_reduce", COMMUNICATION),
    ("gloo:all_reduce", COMMUNICATION),
    ("c10d::allreduce_", COMMUNICATION),
    ("record_param_comms", COMMUNICATION),
    # PyTorch, for traces of other frameworks
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
        ELEMENTWISE,
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float"
        ", "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float"
        ")#1}>, "
        "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float"
        ")#1}>, "
        "unsigned int, float, 4>)",
        REDUCTION,
    ),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
        SOFTMAX,
    ),
    (
        "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>"
        "(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)",
        SOFTMAX,
    ),
    (
        "void at::native::batch_norm_collect_statistics_kernel<at::native::InvStd, float, float, float, int>"
        "(at::GenericPackedTensorAccessor<float const, 3ul, at::RestrictPtrTraits, int>, float, float, "
        "at::GenericPackedTensorAccessor<float, 1ul, at::RestrictPtrTraits, int>)",
        BN,
    ),
    (
        "void at::native::(anonymous namespace)::max_pool_backward_nchw<float, float>(float const*, long con"
        "st*, "
        "int, long, long, long, int, int, int, int, int, int, int, int, int, int, float*)",
        POOL,
    ),
    (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)"
        "::"
        "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
        "(at::native::ADAM_MODE)0, false>, double*, double, double, double, double, double, bool, float*, fl"
        "oat*>"
        "(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
        "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)0, false>, double*, double, double, double, d"
        "ouble, "
        "double, bool, float*, float*)",
        OPTIMIZER,
    ),
    (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 64, 64>(float*, "
        "at::native::(anonymous namespace)::CatArrInputTensorMetadata<float, unsigned int, 64, 64>, "
        "at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)",
        MEMORY,
    ),
    # Real names of ../shared/traces/nvprof-cfd-titanxp.gpu-trace.csv and the nsys CloverLeaf export
    ("cuda_compute_flux(int, float*, float*, float*, float*)", OTHER),
    ("cuda_time_step(int, int, float*, float*, float*, float*)", OTHER),
    ("par_reduce_kernel", REDUCTION),
    (
        "void clover::par_ranged2d_kernel<build_field(global_variables &)::[lambda(int, int) (instance 1)]>"
        "(clover::Range2d, T1)",
        OTHER,
    ),
]

# PyTorch GPU kernels beyond the ones above: ATen, cuBLASLt, fbgemm_gpu and Inductor's Triton
# kernels; the first group are real names of ../shared/traces/kineto-*.json.gz.
PYTORCH_KERNELS: list[tuple[str, str]] = [
    (
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::(anonymous namespace)::"
        "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#14}::"
        "operator()() const::{lambda(float)#1}> >(at::TensorIteratorBase&, float const&)::{lambda(int)#1}>"
        "(int, float)",
        MEMORY,
    ),
    (
        "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, int, unsigned int, 1, 1, -2, true>"
        "(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<float, unsigned int>)",
        MEMORY,
    ),
    (
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long, long, float const*, "
        "float const*, float const*, float const*, float*, float*)",
        BN,
    ),
    (
        "void epilogue::impl::globalKernel<float, float, float, true, true>(int, int, long, float*, "
        "cublasLtEpilogue_t, int, float*, long, void*, long, long, long, float*, long, int*)",
        GEMM,
    ),
    ("void fbgemm_gpu::_offsets_range_cuda_kernel<long>(long, long, long const*, long*)", OTHER),
    ("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)", MEMORY),
    (
        "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<float, float, float, "
        "2ul>(at::GenericPackedTensorAccessor<float, 2ul, at::RestrictPtrTraits, int>)",
        OPTIMIZER,
    ),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", COMMUNICATION),
    ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", COMMUNICATION),
    ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1", CONV_FWD),
    # Triton kernels generated by PyTorch Inductor: triton_<kind>_fused_<ops>_<n>
    ("triton_poi_fused_add_relu_0", ELEMENTWISE),
    ("triton_poi_fused_convolution_relu_3", ELEMENTWISE),
    ("triton_poi_fused_max_pool2d_with_indices_4", POOL),
    ("triton_red_fused_sum_1", REDUCTION),
    ("triton_per_fused_native_layer_norm_2", BN),
    ("triton_red_fused__native_batch_norm_legit_functional_5", BN),
    ("triton_per_fused__log_softmax_nll_loss_forward_6", SOFTMAX),
    ("triton_red_fused__softmax_7", SOFTMAX),
    ("triton_tem_fused_addmm_8", GEMM),
    ("triton_tem_fused_mm_9", GEMM),
    ("triton_tem_fused_convolution_10", CONV_FWD),
    ("triton_for_fused_11", ELEMENTWISE),
    ("triton_poi_fused__foreach_addcdiv_adam_12", OPTIMIZER),
    ("triton_tunable_attention_kernel", OTHER),
]

# ROCm: rocBLAS/hipBLASLt (Tensile) and MIOpen kernels; the Cijk names are real ones of
# ../shared/traces/kineto-rocm-mi250.json.gz.
ROCM_KERNELS: list[tuple[str, str]] = [
    (
        "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_EPS0_"
        "GRVWA2_GRVWB2_GSUAMB_ISA90a_IU1_K1_LBSPPA128_LBSPPB128_LBSPPM0_LPA8_LPB8_LPM0_LRVW4_LWPMn1_MIAV0_MIWT1_1",
        GEMM,
    ),
    ("Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1_SN_LDSB0_AFC1_AFEM1", GEMM),
    ("igemm_fwd_gtcx_nchw_fp32_bx0_ex1_bt64x64x16_wt32x32x2_ws1x1_wr1x1_ta1x4x1x1_1x4x1x64", CONV_FWD),
    ("igemm_bwd_gtcx_nchw_fp32_bx0_ex1_bt64x64x16_wt32x32x2_ws1x1_wr1x1", CONV_DATA),
    ("igemm_wrw_gtcx_nchw_fp32_bx0_ex1_bt64x64x16_wt32x32x2_ws1x1_wr1x1", CONV_FILTER),
    ("naive_conv_fwd_nchw_float_double_float", CONV_FWD),
    ("naive_conv_bwd_nchw_float_double_float", CONV_DATA),
    ("naive_conv_wrw_nchw_float_double_float", CONV_FILTER),
    ("miopenSp3AsmConv_v21_1_3_gfx9_fp32_stride1", CONV_FWD),
    ("MIOpenCvBwdWrW", CONV_FILTER),
    ("MIOpenBatchNormFwdTrainSpatial", BN),
    ("MIOpenPoolingForward", POOL),
]

# The rows of a CPU-only PyTorch profiler trace: ATen ops and autograd nodes as a real
# torch.profiler run of a small conv net names them.
ATEN_OPS: list[tuple[str, str]] = [
    ("aten::lstm", RECURRENT),
    ("aten::mkldnn_rnn_layer", RECURRENT),  # an LSTM's layer on a CPU, forward and backward
    ("aten::mkldnn_rnn_layer_backward", RECURRENT),
    ("MkldnnRnnLayerBackward0", RECURRENT),
    ("aten::_cudnn_rnn", RECURRENT),
    ("aten::_thnn_fused_lstm_cell", RECURRENT),
    ("aten::gru", RECURRENT),
    ("aten::conv2d", CONV_FWD),
    ("aten::convolution", CONV_FWD),
    ("aten::_convolution", CONV_FWD),
    ("aten::mkldnn_convolution", CONV_FWD),
    ("aten::convolution_backward", CONV_DATA),
    ("ConvolutionBackward0", CONV_DATA),
    ("autograd::engine::evaluate_function: ConvolutionBackward0", CONV_DATA),
    ("aten::addmm", GEMM),
    ("aten::mm", GEMM),
    ("aten::bmm", GEMM),
    ("aten::linear", GEMM),
    ("aten::matmul", GEMM),
    ("aten::_addmm_activation", GEMM),
    ("AddmmBackward0", GEMM),
    ("aten::native_batch_norm", BN),
    ("aten::native_batch_norm_backward", BN),
    ("aten::native_layer_norm", BN),
    ("NativeBatchNormBackward0", BN),
    ("aten::max_pool2d_with_indices", POOL),
    ("aten::max_pool2d_with_indices_backward", POOL),
    ("aten::adaptive_avg_pool2d", POOL),
    ("MaxPool2DWithIndicesBackward0", POOL),
    ("aten::_log_softmax", SOFTMAX),
    ("aten::nll_loss_forward", SOFTMAX),
    ("aten::cross_entropy_loss", SOFTMAX),
    ("aten::mse_loss", SOFTMAX),
    ("NllLossBackward0", SOFTMAX),
    ("aten::relu", ELEMENTWISE),
    ("aten::relu_", ELEMENTWISE),
    ("aten::clamp_min", ELEMENTWISE),
    ("aten::threshold_backward", ELEMENTWISE),
    ("aten::add_", ELEMENTWISE),
    ("aten::mul", ELEMENTWISE),
    ("aten::fill_", ELEMENTWISE),
    ("aten::zero_", ELEMENTWISE),
    ("ReluBackward0", ELEMENTWISE),
    ("MulBackward0", ELEMENTWISE),
    ("aten::sum", REDUCTION),
    ("aten::mean", REDUCTION),
    ("aten::embedding_dense_backward", REDUCTION),
    ("EmbeddingBackward0", REDUCTION),
    ("aten::_foreach_add_", OPTIMIZER),
    ("aten::_foreach_mul_", OPTIMIZER),
    ("aten::_fused_adam_", OPTIMIZER),
    ("aten::copy_", MEMORY),
    ("aten::clone", MEMORY),
    ("aten::cat", MEMORY),
    ("aten::embedding", MEMORY),
    ("aten::index_select", MEMORY),
    ("aten::view", OTHER),
    ("aten::t", OTHER),
    ("aten::transpose", OTHER),
    ("aten::permute", OTHER),
    ("aten::as_strided", OTHER),
    ("aten::slice", OTHER),
    ("aten::select", OTHER),
    ("aten::empty", OTHER),
    ("aten::to", OTHER),
    ("aten::detach", OTHER),
    ("TBackward0", OTHER),
    ("ViewBackward0", OTHER),
    ("torch::autograd::AccumulateGrad", OTHER),
    ("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", OTHER),
]

# TF op types, as the CPU ("kernels are ops") traces name them; the first group is the
# real content of ../shared/traces/tf-2.21-cpu-smallcnn.xplane.pb.
OP_TYPES: list[tuple[str, str]] = [
    ("CudnnRNNV3", RECURRENT),
    ("CudnnRNNBackpropV3", RECURRENT),
    ("BlockLSTM", RECURRENT),
    ("GRUBlockCellGrad", RECURRENT),
    ("_MklNativeFusedConv2D", CONV_FWD),
    ("_MklNativeConv2DBackpropFilterWithBias", CONV_FILTER),
    ("_MklNativeFusedMatMul", GEMM),
    ("_MklMatMul", GEMM),
    ("_MklNativeMaxPool", POOL),
    ("_MklNativeMaxPoolGrad", POOL),
    ("ReluGrad", ELEMENTWISE),
    ("SparseSoftmaxCrossEntropyWithLogits", SOFTMAX),
    ("BiasAddGrad", REDUCTION),
    ("Sum", REDUCTION),
    ("AddV2", ELEMENTWISE),
    ("Mul", ELEMENTWISE),
    ("Cast", ELEMENTWISE),
    ("DivNoNan", ELEMENTWISE),
    ("AssignSubVariableOp", OPTIMIZER),
    ("AssignVariableOp", MEMORY),
    ("ReadVariableOp", MEMORY),
    ("Conv2D", CONV_FWD),
    ("_FusedConv2D", CONV_FWD),
    ("_MklNativeConv2D", CONV_FWD),
    ("DepthwiseConv2dNative", CONV_FWD),
    ("Conv2DBackpropInput", CONV_DATA),
    ("_MklNativeConv2DBackpropInput", CONV_DATA),
    ("Conv3DBackpropInputV2", CONV_DATA),
    ("Conv2DBackpropFilter", CONV_FILTER),
    ("_MklNativeConv2DBackpropFilter", CONV_FILTER),
    ("DepthwiseConv2dNativeBackpropFilter", CONV_FILTER),
    ("MatMul", GEMM),
    ("BatchMatMulV2", GEMM),
    ("_FusedMatMul", GEMM),
    ("Einsum", GEMM),
    ("BiasAdd", ELEMENTWISE),
    ("Relu", ELEMENTWISE),
    ("Sub", ELEMENTWISE),
    ("RealDiv", ELEMENTWISE),
    ("Sqrt", ELEMENTWISE),
    ("Square", ELEMENTWISE),
    ("Pow", ELEMENTWISE),
    ("_MklAdd", ELEMENTWISE),
    ("Mean", REDUCTION),
    ("Max", REDUCTION),
    ("ArgMax", REDUCTION),
    ("UnsortedSegmentSum", REDUCTION),
    ("ScatterNd", REDUCTION),
    ("TensorScatterAdd", REDUCTION),
    ("FusedBatchNormV3", BN),
    ("FusedBatchNormGradV3", BN),
    ("_MklFusedBatchNormV3", BN),
    ("MaxPool", POOL),
    ("MaxPoolGrad", POOL),
    ("AvgPool", POOL),
    ("AvgPoolGrad", POOL),
    ("Softmax", SOFTMAX),
    ("LogSoftmax", SOFTMAX),
    ("ResourceApplyAdam", OPTIMIZER),
    ("ResourceApplyGradientDescent", OPTIMIZER),
    ("ResourceApplyKerasMomentum", OPTIMIZER),
    ("AssignAddVariableOp", OPTIMIZER),
    ("Identity", MEMORY),
    ("Transpose", MEMORY),
    ("_MklTranspose", MEMORY),
    ("ConcatV2", MEMORY),
    ("StridedSlice", MEMORY),
    ("GatherV2", MEMORY),
    ("Tile", MEMORY),
    ("_Recv", COMMUNICATION),
    ("_Send", COMMUNICATION),
    ("_HostRecv", COMMUNICATION),
    ("CollectiveReduceV2", COMMUNICATION),
    ("NcclAllReduce", COMMUNICATION),
    ("Reshape", OTHER),
    ("Const", OTHER),
    ("NoOp", OTHER),
    ("StatefulPartitionedCall", OTHER),
    ("OptionalFromValue", OTHER),
]


@pytest.mark.parametrize(("name", "expected"), KERNELS, ids=lambda v: v[:60] if isinstance(v, str) else v)
def test_kernel_names(name: str, expected: str) -> None:
    assert classify(name) == expected


@pytest.mark.parametrize(("name", "expected"), OP_TYPES)
def test_tf_op_types(name: str, expected: str) -> None:
    assert classify(name) == expected


@pytest.mark.parametrize(
    ("name", "expected"), PYTORCH_KERNELS + ROCM_KERNELS, ids=lambda v: v[:60] if isinstance(v, str) else v
)
def test_pytorch_and_rocm_kernel_names(name: str, expected: str) -> None:
    assert classify(name) == expected


@pytest.mark.parametrize(("name", "expected"), ATEN_OPS)
def test_pytorch_cpu_ops_and_autograd_nodes(name: str, expected: str) -> None:
    assert classify(name) == expected


KINETO_TRACES = ["kineto-a100-control", "kineto-v100-test", "kineto-alexnet-a100", "kineto-rocm-mi250"]


@pytest.mark.parametrize("trace", KINETO_TRACES)
def test_what_stays_other_in_the_real_pytorch_traces(trace: str) -> None:
    """Only kernels whose work no category describes: sorting, searching, index bookkeeping."""
    import gzip
    import json

    from detprof.traces.kernel_names import short_kernel_name

    path = SHARED_TRACES / f"{trace}.json.gz"
    require_real_traces(path)
    with gzip.open(path, "rt") as fh:
        names = {e["name"] for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel"}
    other = {short_kernel_name(n) for n in names if classify(n) == OTHER}
    assert other <= {
        "DeviceRadixSortExclusiveSumKernel",
        "DeviceRadixSortHistogramKernel",
        "DeviceRadixSortOnesweepKernel",
        "_offsets_range_cuda_kernel",
        "bounds_check_indices_kernel",
        "linearize_index_kernel",
        "searchsorted_cuda_kernel",
        "to_dense_representation_kernel",
    }


def test_categories_are_the_documented_fourteen_in_order() -> None:
    assert CATEGORIES == (
        CONV_FWD,
        CONV_DATA,
        CONV_FILTER,
        GEMM,
        ELEMENTWISE,
        REDUCTION,
        BN,
        POOL,
        SOFTMAX,
        RECURRENT,
        OPTIMIZER,
        MEMORY,
        COMMUNICATION,
        OTHER,
    )
    covered = {category for _, category in KERNELS + OP_TYPES}
    assert covered == set(CATEGORIES)


@pytest.mark.parametrize("name", ["", " ", "(", ")", "()", "((((", "))))", "<<>>", "中文内核", "\x00\xff", "::"])
def test_odd_names_are_other(name: str) -> None:
    assert classify(name) == OTHER


def test_any_string_gets_a_category() -> None:
    rng = random.Random(1234)
    alphabet = string.printable + "<>():,*&#ÄΩ中"
    names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))) for _ in range(2000)]
    # Random slices of real names too, so that half-patterns and unbalanced brackets occur.
    real = [name for name, _ in KERNELS]
    for _ in range(2000):
        name = rng.choice(real)
        start = rng.randint(0, len(name))
        names.append(name[start : start + rng.randint(0, 200)])
    for name in names:
        assert classify(name) in CATEGORIES


@real_traces(SHARED_TRACES / "tf-bert-3gpu.xplane.pb")
def test_every_kernel_of_the_bert_trace_gets_its_ops_category() -> None:
    """Each kernel's TF op (from its annotation) says what the kernel does."""
    from detprof.traces.parsers.tf_xplane import load_xplane

    by_op_type = {
        "RandomUniform": ELEMENTWISE,
        "GreaterEqual": ELEMENTWISE,
        "Cast": ELEMENTWISE,
        "Mul": ELEMENTWISE,
        "Reciprocal": ELEMENTWISE,
        "BroadcastTo": MEMORY,
        "Tile": MEMORY,
    }
    kernels = load_xplane(SHARED_TRACES / "tf-bert-3gpu.xplane.pb").kernels
    pairs = set(zip(kernels["name"].astype(str), kernels["op"].astype(str).str.rsplit(":", n=1).str[-1], strict=True))
    assert {op_type for _, op_type in pairs} == set(by_op_type)
    for name, op_type in pairs:
        assert classify(name) == by_op_type[op_type], (op_type, name)
