# Which GPUs the CUDA path is compiled for, when CMAKE_CUDA_ARCHITECTURES (variable or environment)
# does not say:
# - the GPUs this machine has, as nvidia-smi reports them (machine code for each: the fastest
#   build, and what runs here);
# - with no GPU visible (a build machine, a container without the driver): PTX for sm_80, which
#   the driver compiles once for any GPU from A100 on at first use, and caches.
# RINGTREE_CUDA_ARCHITECTURES_ALL is the list a package for every recent data-centre GPU needs
# (A100 sm_80, H100/H200 sm_90, B200/GB200 sm_100, and PTX for later ones): pass it as
# CMAKE_CUDA_ARCHITECTURES to build that.
set(RINGTREE_CUDA_ARCHITECTURES_ALL "80-real;90-real;100-real;100-virtual")
set(RINGTREE_CUDA_ARCHITECTURES_NO_GPU "80-virtual")

# The GPUs nvidia-smi sees, as architectures ("90-real"), sorted and without repeats; empty when
# there is none. `caps` is nvidia-smi's compute_cap output ("9.0" per line) where a caller (the
# tests) has it already.
function(ringtree_visible_gpu_architectures out)
  if(ARGC GREATER 1)
    set(caps "${ARGV1}")
  else()
    set(caps "")
    find_program(RINGTREE_NVIDIA_SMI nvidia-smi)
    if(RINGTREE_NVIDIA_SMI)
      execute_process(COMMAND ${RINGTREE_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                      OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 30)
      if(NOT rc EQUAL 0)
        set(caps "")
      endif()
    endif()
  endif()
  string(REGEX MATCHALL "[0-9]+\\.[0-9]+" caps "${caps}")
  set(archs "")
  foreach(cap IN LISTS caps)
    string(REPLACE "." "" arch "${cap}")
    list(APPEND archs "${arch}-real")
  endforeach()
  list(REMOVE_DUPLICATES archs)
  list(SORT archs COMPARE NATURAL)
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# CMAKE_CUDA_ARCHITECTURES as set, else from the environment, else as above.
function(ringtree_cuda_architectures out)
  if(DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(archs "${CMAKE_CUDA_ARCHITECTURES}")
  elseif(DEFINED ENV{CMAKE_CUDA_ARCHITECTURES} AND NOT "$ENV{CMAKE_CUDA_ARCHITECTURES}" STREQUAL "")
    set(archs "$ENV{CMAKE_CUDA_ARCHITECTURES}")
  else()
    ringtree_visible_gpu_architectures(archs ${ARGN})
    if(NOT archs)
      set(archs "${RINGTREE_CUDA_ARCHITECTURES_NO_GPU}")
    endif()
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()
