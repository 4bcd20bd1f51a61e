// rotvid's CUDA extension module: the functions every binding file registered with ROTVID_BINDINGS (common/binding.h)
// -- each recipe's (rotvid/kernels/recipes/<name>/csrc/binding_<name>.cpp) and the shared kernels'
// (common/binding_common.cpp) -- bound into one Python module at import. This file names none of them: a recipe with a
// kernel adds its binding file to its folder and the build (rotvid/kernels/cuda_sources.py) compiles it in.
#include <set>
#include <string>

#include "common/binding.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  std::set<std::string> seen;
  for (const rotvid::ext::Binding& b : rotvid::ext::bindings()) {
    TORCH_CHECK(seen.insert(b.name).second, "rotvid extension: two binding blocks named '", b.name, "'");
    b.bind(m);
  }
}
