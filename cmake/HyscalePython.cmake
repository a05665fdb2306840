# The Python interpreter for the benchmarks' smoke tests: the first of `python3` on PATH and
# /usr/bin/python3 whose torch is the libtorch HyScale builds against (they load its ops library),
# so PyTorch's interpreter on a GPU machine and Debian's python3-torch on the CPU machine.
function(hyscale_find_torch_python)
  if(DEFINED CACHE{HYSCALE_TORCH_PYTHON})
    return()
  endif()
  find_program(_path_python3 python3 NO_CACHE)
  set(_found "")
  foreach(candidate IN ITEMS ${_path_python3} /usr/bin/python3)
    if(NOT _found AND EXISTS "${candidate}")
      execute_process(
        COMMAND "${candidate}" -c "import torch, yaml; print(torch.__version__)"
        OUTPUT_VARIABLE _version OUTPUT_STRIP_TRAILING_WHITESPACE
        RESULT_VARIABLE _failed ERROR_QUIET)
      if(NOT _failed AND _version MATCHES "^${Torch_VERSION_MAJOR}\\.${Torch_VERSION_MINOR}")
        set(_found "${candidate}")
      endif()
    endif()
  endforeach()
  if(NOT _found)
    message(STATUS "No python3 with torch ${Torch_VERSION} and PyYAML: the benchmark smoke tests are not registered")
  endif()
  set(HYSCALE_TORCH_PYTHON "${_found}" CACHE FILEPATH "python3 whose torch matches libtorch")
endfunction()
