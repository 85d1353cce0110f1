// Map nodes kept for reuse: a steady stream of tickets, requests and Steps allocates no map
// node, nor the object and buffers a node holds (worker/request_tracker.hpp,
// worker/step_batch.hpp).
#pragma once

#include <utility>
#include <vector>

namespace parasol {

// A node of `Map` for `key`: the newest of `spares`, its value as its last entry left it (the
// caller resets what it must), or a new node holding `make()`.
template <typename Map, typename Make>
typename Map::node_type TakeNode(std::vector<typename Map::node_type>& spares,
                                 const typename Map::key_type& key, Make&& make) {
  if (!spares.empty()) {
    typename Map::node_type node = std::move(spares.back());
    spares.pop_back();
    node.key() = key;
    return node;
  }
  Map one;
  one.emplace(key, make());
  return one.extract(one.begin());
}

}  // namespace parasol
