// A Python callable as the ChoiceHook of a communicator or an AlgoChoice: it receives the request
// as a tuple (collective, bytes, dtype, nranks, nhosts, [(algo, seconds, formula)], model's
// algo), all codes, and returns an algo code (ringtree/_choice.py wraps a user's hook in that).
#pragma once
#include <pybind11/pybind11.h>
#include <memory>
#include "ringtree/communicator.h"

namespace ringtree {

class PyChoiceHook : public ChoiceHook {
 public:
  explicit PyChoiceHook(pybind11::object fn) : fn_(std::move(fn)) {}
  ~PyChoiceHook() override {
    if (!Py_IsInitialized()) {
      fn_.release();  // the interpreter is gone: nothing left to release it into
      return;
    }
    pybind11::gil_scoped_acquire gil;
    fn_ = pybind11::object();
  }

  Algo choose(const ChoiceRequest& r) override {
    pybind11::gil_scoped_acquire gil;
    pybind11::list candidates;
    for (const AlgoEstimate& e : r.candidates)
      candidates.append(pybind11::make_tuple(static_cast<int>(e.algo), e.seconds, e.formula));
    const pybind11::object answer =
        fn_(pybind11::make_tuple(static_cast<int>(r.coll), r.bytes, static_cast<int>(r.dtype), r.nranks, r.nhosts,
                                 candidates, static_cast<int>(r.model_choice)));
    const int code = answer.cast<int>();
    return code >= 0 && code < static_cast<int>(Algo::Count) ? static_cast<Algo>(code) : Algo::Count;
  }

 private:
  pybind11::object fn_;
};

// None: no hook.
inline std::shared_ptr<ChoiceHook> choice_hook_of(const pybind11::object& fn) {
  if (fn.is_none()) return nullptr;
  return std::make_shared<PyChoiceHook>(fn);
}

}  // namespace ringtree
