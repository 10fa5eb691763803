// python/src/options.h — the keyword options of kvmesh's data calls
// (Client.get, put, keys, ..., Sequence.append, ...; docs/python.md,
// "Options"), written once.
//
// KVMESH_CALL_OPTIONS lists each option: its name, the Python type help()
// shows, its default, the setter that converts a value (convert.h) and what
// it does. From that one list come the keyword-only arguments every such
// method is bound with (DefWithOptions: help() shows "*, priority: int = 1,
// layers: Optional[Tuple[int, int]] = None, ..."), their help text
// (OptionsDoc) and the RequestOptions a call receives (WithOptions).
// python/kvmesh/_core.pyi declares the same names and types as the TypedDict
// CallOptions; python/tests/test_signatures.py checks the two agree.
//
// The values reach the setters as Python objects, so a bad value raises
// kvmesh.InvalidArgumentError naming the option (not pybind11's TypeError),
// and so does a keyword that is no option (the trailing **kwargs).
//
// Everything here runs with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "convert.h"
#include "kvmesh/request.h"

// X(name, Python type, default, setter, what it does)
#define KVMESH_CALL_OPTIONS(X)                                                                                  \
  X(priority, "int", int{kDefaultPriority}, SetPriority, "eviction class of the blocks stored or touched (0 is " \
                                                        "evicted first)")                                       \
  X(layers, "Optional[Tuple[int, int]]", py::none(), SetLayers, "(begin, end) slice of layers; None = all")     \
  X(heads, "Optional[Tuple[int, int]]", py::none(), SetHeads, "(begin, end) slice of KV heads; None = all")     \
  X(timeout_ms, "int", 0, SetTimeout, "0 = the client's timeout")                                               \
  X(expert, "Optional[int]", py::none(), SetExpert, "placement hint: the expert")                               \
  X(layer_group, "Optional[int]", py::none(), SetLayerGroup, "placement hint: the layer group")                 \
  X(rank, "Optional[int]", py::none(), SetRank, "placement hint: the rank")                                     \
  X(score, "float", 0.0, SetScore, "importance hint for score-based policies")                                 \
  X(replace, "bool", false, SetReplace, "put: overwrite a block stored under the same key")

namespace kvmesh::python {

// One type per option, holding the Python value as given: its caster (below)
// takes any object and shows the option's Python type in signatures.
struct OptionArg {
  py::object value;
};
namespace option_arg {
#define KVMESH_OPTION_TYPE(name, type, def, set, doc) \
  struct name : OptionArg {                           \
    static constexpr auto kPyType = py::detail::const_name(type); \
  };
KVMESH_CALL_OPTIONS(KVMESH_OPTION_TYPE)
#undef KVMESH_OPTION_TYPE
}  // namespace option_arg

// "\n\nOptions (keyword-only): ..." with a line per option, for docstrings.
const std::string& OptionsDoc();

// InvalidArgument naming the first keyword of `other` (none is an option).
void RefuseOtherOptions(const py::kwargs& other);

namespace detail {

template <typename R, typename Args, typename F, size_t... I>
auto WithOptionsImpl(F f, std::index_sequence<I...>) {
#define KVMESH_OPTION_PARAM(name, type, def, set, doc) option_arg::name name,
#define KVMESH_OPTION_SET(name, type, def, set, doc) set(o, name.value);
  return [f = std::move(f)](std::tuple_element_t<I, Args>... args, KVMESH_CALL_OPTIONS(KVMESH_OPTION_PARAM)
                                                                       const py::kwargs& other) -> R {
    RefuseOtherOptions(other);
    RequestOptions o;
    KVMESH_CALL_OPTIONS(KVMESH_OPTION_SET)
    return std::invoke(f, std::forward<std::tuple_element_t<I, Args>>(args)..., std::as_const(o));
  };
#undef KVMESH_OPTION_SET
#undef KVMESH_OPTION_PARAM
}

template <typename F, typename R, typename L, typename... P>
auto WithOptionsLambda(F f, R (L::*)(P...) const) {
  static_assert(std::is_same_v<std::tuple_element_t<sizeof...(P) - 1, std::tuple<P...>>, const RequestOptions&>,
                "the last parameter is the call's options");
  return WithOptionsImpl<R, std::tuple<P...>>(std::move(f), std::make_index_sequence<sizeof...(P) - 1>{});
}

}  // namespace detail

// The bound form of `f`, a member function or a lambda whose last parameter
// is `const RequestOptions&`: the same parameters but that one, then one
// parameter per option, then **kwargs (refused).
template <typename R, typename C, typename... P>
auto WithOptions(R (C::*f)(P...)) {
  static_assert(std::is_same_v<std::tuple_element_t<sizeof...(P) - 1, std::tuple<P...>>, const RequestOptions&>,
                "the last parameter is the call's options");
  return detail::WithOptionsImpl<R, std::tuple<C&, P...>>(f, std::make_index_sequence<sizeof...(P)>{});
}
template <typename F>
auto WithOptions(F f) {
  return detail::WithOptionsLambda(std::move(f), &F::operator());
}

// cls.def(method, WithOptions(f), extra..., [py::kw_only(),] the options'
// keywords with their defaults, doc + OptionsDoc()). `extra` names f's other
// parameters (py::arg); the options are keyword-only.
template <typename Class, typename F, typename... Extra>
Class& DefWithOptions(Class& cls, const char* method, F f, const char* doc, const Extra&... extra) {
  const std::string text = doc + OptionsDoc();
#define KVMESH_OPTION_KEYWORD(name, type, def, set, what) py::arg(#name) = def,
  if constexpr ((std::is_same_v<Extra, py::kw_only> || ...)) {
    return cls.def(method, WithOptions(std::move(f)), extra..., KVMESH_CALL_OPTIONS(KVMESH_OPTION_KEYWORD)
                       text.c_str());
  } else {
    return cls.def(method, WithOptions(std::move(f)), extra..., py::kw_only(),
                   KVMESH_CALL_OPTIONS(KVMESH_OPTION_KEYWORD) text.c_str());
  }
#undef KVMESH_OPTION_KEYWORD
}

}  // namespace kvmesh::python

namespace pybind11::detail {

// Any object, kept as given; shown as the option's Python type.
template <typename T>
struct type_caster<T, enable_if_t<std::is_base_of_v<kvmesh::python::OptionArg, T>>> {
  PYBIND11_TYPE_CASTER(T, T::kPyType);
  bool load(handle src, bool) {
    value.value = reinterpret_borrow<object>(src);
    return true;
  }
  static handle cast(const T& v, return_value_policy, handle) { return v.value.inc_ref(); }
};

}  // namespace pybind11::detail
