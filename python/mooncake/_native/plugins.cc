// mooncake._native plugin listing: every transport and platform plugin this process knows (linked in or loaded
// from mooncake/_plugins/ and MC_PLUGIN_DIR), with its state. No logic here: see transfer_engine/plugin/loader.h.
#include <nanobind/nanobind.h>

#include <string>
#include <vector>

#include "transfer_engine/plugin/loader.h"

namespace nb = nanobind;

namespace mooncake::python {

void RegisterPlugins(nb::module_& m) {
  m.def("plugin_states", [] {
    std::vector<te::PluginInfo> states;
    {
      nb::gil_scoped_release release;  // the first call loads plugins (dlopen, probes)
      states = te::PluginStates();
    }
    nb::list out;
    for (const te::PluginInfo& p : states) {
      nb::list protocols;
      for (const std::string& proto : p.protocols) protocols.append(nb::str(proto.c_str(), proto.size()));
      nb::dict d;
      d["name"] = nb::str(p.name.c_str(), p.name.size());
      d["kind"] = nb::str(p.kind.c_str(), p.kind.size());
      d["origin"] = nb::str(p.origin.c_str(), p.origin.size());
      d["protocols"] = protocols;
      d["state"] = nb::str(te::PluginStateName(p.state));
      d["reason"] = nb::str(p.reason.c_str(), p.reason.size());
      out.append(d);
    }
    return out;
  },
  "Every transport and platform plugin: a list of dicts {name, kind ('transport'/'platform'), origin ('builtin'\n"
  "or the .so path), protocols, state ('loaded', 'unusable', 'library_missing', 'refused', 'error'), reason}.\n"
  "The first call loads the plugin files (MC_PLUGIN_DIR, then mooncake/_plugins/); a plugin that cannot be used\n"
  "is listed with its reason, never raised.");
}

}  // namespace mooncake::python
