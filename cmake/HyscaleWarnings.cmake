# Warnings for HyScale's own targets (never for generated or third-party code).
function(hyscale_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow=local -Wnon-virtual-dtor>)
  if(HYSCALE_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# Targets that instantiate libtorch templates: GCC 13 reports false -Warray-bounds and
# -Wstringop-overflow inside torch::autograd::Function::apply (its std::vector<bool>::reserve)
# at -O3.
function(hyscale_torch_warnings target)
  hyscale_warnings(${target})
  target_compile_options(${target} PRIVATE
    $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_GREATER_EQUAL:$<CXX_COMPILER_VERSION>,13>>:-Wno-array-bounds;-Wno-stringop-overflow>)
endfunction()
