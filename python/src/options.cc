#include "options.h"

namespace kvmesh::python {

const std::string& OptionsDoc() {
  static const std::string doc = [] {
    std::string d = "\n\nOptions (keyword-only; every data call takes them):";
#define KVMESH_OPTION_DOC(name, type, def, set, what)                                                   \
  d += std::string("\n  ") + #name + ": " + type + " = " + std::string(py::repr((py::arg(#name) = def).value)) + "  " + \
       what;
    KVMESH_CALL_OPTIONS(KVMESH_OPTION_DOC)
#undef KVMESH_OPTION_DOC
    return d;
  }();
  return doc;
}

void RefuseOtherOptions(const py::kwargs& other) {
  for (auto [k, v] : other) Throw(InvalidArgument("unknown option '" + py::cast<std::string>(k) + "'"));
}

}  // namespace kvmesh::python
