// A new autograd Node, owned as the LibTorch at hand owns them. LibTorch up to 2.13 holds nodes in
// std::shared_ptr<Node> (made with torch::autograd::deleteNode, which frees long chains of nodes without deep
// recursion); from 2.14 on, Node is a c10::intrusive_ptr_target held in c10::intrusive_ptr<Node> (PyTorch's
// "autograd nodes as intrusive_ptr" change) and deleteNode is gone. Which one is decided from the Node class itself,
// not from a version number, so a LibTorch with either API compiles; set_history and the edges take either pointer.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <memory>
#include <type_traits>

namespace dapo::detail {

// A default-constructed NodeT (derived from torch::autograd::Node) in the pointer type set_history takes.
template <class NodeT>
auto make_autograd_node() {
  static_assert(std::is_base_of_v<torch::autograd::Node, NodeT>, "make_autograd_node: NodeT must derive from Node");
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, NodeT>) {
    return c10::make_intrusive<NodeT>();
  } else {
    // deleteNode(Node*) is found through the argument's type (NodeT derives from torch::autograd::Node) when the
    // template is instantiated: a LibTorch without it never instantiates this branch.
    return std::shared_ptr<NodeT>(new NodeT(), [](NodeT* node) { deleteNode(node); });
  }
}

// A node's owning pointer from inside it (as SavedVariable::unpack takes it, to restore a saved output's history):
// shared_from_this() up to LibTorch 2.13, a new reference of the intrusive count from 2.14.
template <class NodeT>
auto owning_pointer(NodeT* node) {
  using Base = std::conditional_t<true, torch::autograd::Node, NodeT>;  // Node, named so that it depends on NodeT
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, Base>) {
    return c10::intrusive_ptr<Base>::reclaim_copy(node);
  } else {
    return std::static_pointer_cast<Base>(node->shared_from_this());
  }
}

}  // namespace dapo::detail
